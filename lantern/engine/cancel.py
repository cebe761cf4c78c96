"""Cancelling a run: flag it, and finish the cancellation here when nobody is executing it.

A run that a replica is executing is stopped by that replica: its lease keeper sees the flag
within a second, cancels the steps in flight and journals ``run_cancelled`` itself, so the
journal keeps one writer. A queued or parked run holds no live lease, so it is finished here.
Cancelling a run cancels the runs its sub-agents started, and theirs.
"""

from __future__ import annotations

from contextlib import suppress

from lantern.engine import commits
from lantern.engine.journal import EventWriter, fold
from lantern.errors import Conflict, NotFound
from lantern.observability import metrics
from lantern.store.base import Store
from lantern.store.records import Append, Run, RunUpdate

CANCELLED = {"code": "cancelled", "message": "the run was cancelled on request"}


async def cancel_run(store: Store, run_id: str, worker_id: str, ttl: float) -> Run:
    run = await store.get_run(run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found")
    if run.finished or not await store.request_cancel(run_id):
        raise Conflict(f"run {run_id} has already finished ({run.status})")
    # Only a free or expired lease: a live holder, even in this process, cancels it itself.
    lease = await store.acquire_lease(run_id, worker_id, ttl, reclaim=False)
    if lease is not None:
        state = fold(await store.events(run_id))
        if state.terminal is None:
            w = EventWriter(run_id, state.last_seq, state.last_hash)
            event = w.event("run_cancelled", {"by": "request"})
            batch = Append(lease, (event,), RunUpdate("cancelled", error=CANCELLED))
            await commits.append(store, batch, patience=ttl)
            metrics.committed((event,))
        else:
            await store.release_lease(lease)
    for child in await store.children(run_id):
        if not child.finished:
            with suppress(Conflict):  # it finished meanwhile
                await cancel_run(store, child.id, worker_id, ttl)
    found = await store.get_run(run_id)
    assert found is not None
    return found
