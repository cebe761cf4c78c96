"""Cancelling a run: flag it, and finish the cancellation here when nobody is executing it.

A run that a replica is executing is stopped by that replica: its lease keeper sees the flag
within about half a second, cancels the steps in flight and journals ``run_cancelled`` itself,
so the journal keeps one writer. A queued or parked run holds no live lease, so it is finished
here; so is a run whose drive gave its lease up (parked, stopped) before its keeper looked: the
drive finds the flag then (``finish_if_free``).
Cancelling a run cancels the runs its sub-agents started, and theirs.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress

from lantern.engine import commits, vm_cancel
from lantern.engine import events as ev
from lantern.engine.journal import EventWriter, fold
from lantern.errors import Conflict, NotFound
from lantern.store.base import Store
from lantern.store.records import Append, Lease, Run, RunUpdate
from lantern.store.runtime import Vm


async def cancel_run(store: Store, run_id: str, worker_id: str, ttl: float) -> Run:
    run = await store.get_run(run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found")
    if run.finished or not await store.request_cancel(run_id):
        raise Conflict(f"run {run_id} has already finished ({run.status})")
    await _cancel(store, run_id, worker_id, ttl)
    # The runs its sub-agents started, and theirs: a worklist, not recursion, so a chain of
    # any depth is cancelled without exhausting the stack.
    pending = [run_id]
    while pending:
        for child in await store.children(pending.pop()):
            if child.finished or not await store.request_cancel(child.id):
                continue  # it finished meanwhile
            await _cancel(store, child.id, worker_id, ttl)
            pending.append(child.id)
    found = await store.get_run(run_id)
    assert found is not None
    return found


async def _cancel(store: Store, run_id: str, worker_id: str, ttl: float) -> None:
    """A flagged run's cancellation: a microVM run's live VM is ended at once (its runtime
    node holds the lease and no drive would see the flag: ``vm_cancel``), any other run is
    finished here unless its lease holder will."""
    vm = await vm_cancel.end_live_vm(store, run_id)
    if vm is not None and await vm_cancel.finish_taken(store, vm, ttl):
        return
    await finish_if_free(store, run_id, worker_id, ttl, vm)


async def finish_if_free(
    store: Store, run_id: str, worker_id: str, ttl: float, vm: Vm | None = None
) -> None:
    """Journal a flagged run's cancellation unless a live lease holder will (a holder, even
    in this process, cancels its run itself); ``vm``: a VM of the run the cancel ended before
    its runtime node took it."""
    lease = await store.acquire_lease(run_id, _holder(worker_id), ttl, reclaim=False)
    if lease is not None:
        await _finish(store, lease, ttl, vm)


def _holder(worker_id: str) -> str:
    """Whom the lease names while a cancel finishes a run: not the replica itself. A replica
    takes back at once a lease that names its own id (its runs after a restart; the opening
    of a queued run), so a drive of this replica starting the run meanwhile would take it
    from under the cancel, whose commit would be refused as the run went on."""
    return f"{worker_id}:cancel"


async def _finish(store: Store, lease: Lease, ttl: float, vm: Vm | None = None) -> None:
    """Journal the cancellation under ``lease``; whatever happens, the lease is not left held
    (the commit that finishes the run releases it; anything else gives it back here)."""
    try:
        state = fold(await store.events(lease.run_id))  # outputs in blobs stay references
        if state.terminal is None:
            w = EventWriter(lease.run_id, state.last_seq, state.last_hash)
            ended = () if vm is None else (vm_cancel.terminated(w, vm),)
            event = w.event(ev.RUN_CANCELLED, {"by": "request"})
            batch = Append(lease, (*ended, event), RunUpdate("cancelled", error=ev.CANCELLED))
            run = await store.get_run(lease.run_id)  # for the run's log line
            await commits.commit(store, batch, patience=ttl, run=run)  # across a database blink
            return
    except BaseException:
        with suppress(Exception):  # the first failure is the one to report
            await asyncio.shield(store.release_lease(lease))
        raise
    await store.release_lease(lease)
