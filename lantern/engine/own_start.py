"""Starting one run outside a replica's claim loop (``lantern run --wait`` with no server: the
CLI executes the run in its own process) while keeping its flow control: the run waits for the
slot its concurrency key and its agent would give it in a claim (docs/flow-control.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from lantern.store.base import Store
from lantern.store.records import Lease, Run

POLL = 0.2  # seconds between looks for a free slot: the claim's own poll interval


async def slot(
    store: Store, run: Run, worker_id: str, ttl: float, waiting: Callable[[], None]
) -> Lease | None:
    """The run's lease, won as a claim would win it (``Store.claim_run``) once its key and
    agent have a slot for it; ``waiting`` is called once if it has to wait. None when a
    server's replica claimed the run meanwhile (it is no longer queued)."""
    told = False
    while True:
        lease = await store.claim_run(run.id, worker_id, ttl)
        if lease is not None:
            return lease
        now = await store.get_run(run.id)
        if now is None or now.status != "queued":
            return None
        if not told:
            waiting()
            told = True
        await asyncio.sleep(POLL)


async def settled(store: Store, run_id: str) -> Run | None:
    """The run once it finished or parks, executed by whichever replica claimed it."""
    while True:
        run = await store.get_run(run_id)
        if run is None or run.finished or run.status == "waiting":
            return run
        await asyncio.sleep(POLL)
