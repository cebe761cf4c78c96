"""Starting one run outside a replica's claim loop (``lantern run --wait`` with no server: the
CLI executes the run in its own process) while keeping its flow control: the run waits for the
slot its concurrency key and its agent would give it in a claim (docs/flow-control.md). A run
that parks there for a rate limit's wait has no dispatcher to claim it when due: the CLI waits
for its due time (``throttled_until``) and takes it again as a claim would (``due``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from lantern.engine.journal import fold
from lantern.store.base import Store
from lantern.store.records import Lease, Run, RunStatus

POLL = 0.2  # seconds between looks for a free slot: the claim's own poll interval


async def slot(
    store: Store, run: Run, worker_id: str, ttl: float, waiting: Callable[[], None]
) -> Lease | None:
    """The run's lease, won as a claim would win it (``Store.claim_run``) once its key and
    agent have a slot for it; ``waiting`` is called once if it has to wait. None when a
    server's replica claimed the run meanwhile (it is no longer queued)."""
    return await _claimed(store, run.id, worker_id, ttl, "queued", waiting)


async def settled(store: Store, run_id: str) -> Run | None:
    """The run once it finished or parks, executed by whichever replica claimed it."""
    while True:
        run = await store.get_run(run_id)
        if run is None or run.finished or run.status == "waiting":
            return run
        await asyncio.sleep(POLL)


async def throttled_until(store: Store, run_id: str) -> int | None:
    """When a run parked for a rate limit's wait (``step_throttled``) is due again (epoch
    ms: the first of its timed waits), or None when no rate limit holds it back (it waits
    for a decision, a signal, a child, a timer)."""
    state = fold(await store.events(run_id))
    if not state.throttled or state.terminal is not None:
        return None
    return min(due for _, due in state.backing_off.values())


async def due(store: Store, run_id: str, worker_id: str, ttl: float, due_ms: int) -> Lease | None:
    """The lease of a parked run, won as a claim would win it once ``due_ms`` has come (and
    its key and agent have a slot for it); None when a server's replica took it meanwhile
    (it is no longer waiting)."""
    await asyncio.sleep(max(0.0, due_ms / 1000 - time.time()))
    return await _claimed(store, run_id, worker_id, ttl, "waiting", lambda: None)


async def _claimed(
    store: Store,
    run_id: str,
    worker_id: str,
    ttl: float,
    status: RunStatus,
    waiting: Callable[[], None],
) -> Lease | None:
    """``Store.claim_run``, tried every ``POLL`` while the run is still ``status`` (``waiting``
    called before the first wait); None once it is not (a server's replica took it)."""
    told = False
    while True:
        lease = await store.claim_run(run_id, worker_id, ttl)
        if lease is not None:
            return lease
        now = await store.get_run(run_id)
        if now is None or now.status != status:
            return None
        if not told:
            waiting()
            told = True
        await asyncio.sleep(POLL)
