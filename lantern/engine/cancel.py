"""Cancelling a run: flag it, and finish the cancellation here when nobody is executing it.

A run that a replica is executing is stopped by that replica: its lease keeper sees the flag
within about half a second, cancels the steps in flight and journals ``run_cancelled`` itself,
so the journal keeps one writer. A queued or parked run holds no live lease, so it is finished
here; so is a run whose drive gave its lease up (parked, stopped) before its keeper looked: the
drive finds the flag then (``finish_if_free``). Both may try at once (a cancel that lands as
the drive lets go): one takes the lease and finishes the run, and the cancel that lost waits
for that, so it answers with the run cancelled as it does for any queued or parked run.
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

# How long a cancel waits for the holder of a queued or parked run's lease to act on the flag
# (one commit, or a drive's opening: well under a second), and how often it reads the run
# meanwhile (the safety net for a commit notification missed, as from another process).
SETTLE_S = 5.0
REREAD_S = 0.05


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
    await _finish_or_wait(store, run_id, worker_id, ttl, vm)


async def _finish_or_wait(
    store: Store, run_id: str, worker_id: str, ttl: float, vm: Vm | None
) -> None:
    """Finish the flagged run here, or leave it to the live lease holder that will. A queued
    or parked run's lease is held only for a moment, by someone about to act on the flag:
    another party finishing the cancellation (the drive that parked it, finding the flag as it
    let go; another cancel), or a drive opening the run, which cancels it or shows it running.
    Wait for that (``SETTLE_S`` at most: a holder that died leaves the run to the sweep's
    drive), taking the lease whenever it is let go; a running run is its drive's to stop."""

    async def settled() -> bool:
        """Finished here, or no longer queued or parked (finished, or running: its drive
        stops it)."""
        if await finish_if_free(store, run_id, worker_id, ttl, vm):
            return True
        run = await store.get_run(run_id)
        return run is None or run.status not in ("queued", "waiting")

    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_S
    if await settled():
        return
    # Subscribed only now: most cancels never wait (a commit before it costs one re-read).
    with store.notifier.subscribe(run_id) as sub:
        while (left := deadline - loop.time()) > 0:
            if sub.finished:  # heard of its end, yet read before it: never a busy loop
                await asyncio.sleep(min(left, REREAD_S))
            else:
                await sub.until_finished(timeout=min(left, REREAD_S))
            if await settled():
                return


async def finish_if_free(
    store: Store, run_id: str, worker_id: str, ttl: float, vm: Vm | None = None
) -> bool:
    """Journal a flagged run's cancellation unless a live lease holder will (a holder, even
    in this process, cancels its run itself); ``vm``: a VM of the run the cancel ended before
    its runtime node took it. False: a live holder has the run."""
    lease = await store.acquire_lease(run_id, _holder(worker_id), ttl, reclaim=False)
    if lease is not None:
        await _finish(store, lease, ttl, vm)
    return lease is not None


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
