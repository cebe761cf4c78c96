"""Cancelling a microVM run: its live VM is ended here, not waited for.

A microVM run's lease is held by the runtime node whose VM runs it, so a cancel cannot take
the lease and no drive of a replica will see the flag. The cancel ends the VM's row
(``terminated``, reason ``cancelled``) first, so that from then on every report and call of
that VM is refused (409) and its runtime node, which watches its VMs' rows, kills it; then it
journals ``vm_terminated`` and ``run_cancelled`` through THE fenced commit under the node's own
lease epoch (the epoch on the VM's row), as the relay writes the VM's reports. A VM placed
but not yet taken by its node holds no lease: the run is finished by the ordinary path
(``cancel.finish_if_free``), or by the scheduler, which cancels a flagged run instead of
placing it.
"""

from __future__ import annotations

from lantern.engine import commits
from lantern.engine import events as ev
from lantern.engine.journal import EventWriter
from lantern.errors import LeaseLost, StoreError, StoreUnavailable
from lantern.store.base import Store
from lantern.store.records import Append, Lease, NewEvent, RunUpdate
from lantern.store.runtime import Vm

REASON = "cancelled"


def terminated(writer: EventWriter, vm: Vm) -> NewEvent:
    """The ``vm_terminated`` of a VM a cancel ended."""
    data = {
        "vmId": vm.vm_id,
        "nodeId": vm.node_id,
        "attempt": vm.attempt,
        "exitCode": None,
        "reason": REASON,
    }
    return writer.event(ev.VM_TERMINATED, data)


async def end_live_vm(store: Store, run_id: str) -> Vm | None:
    """End the run's live VM, if it has one (``terminated``, ``cancelled``); that VM."""
    for vm in reversed(await store.run_vms(run_id)):
        if vm.live and await store.end_vm(vm.vm_id, "terminated", REASON, None):
            return vm
    return None


async def finish_taken(store: Store, vm: Vm, ttl: float) -> bool:
    """Journal the cancellation of ``vm``'s run under the lease its runtime node holds (the
    epoch on the VM's row); False when that VM was not taken or its lease has moved on (the
    next holder finds the run flagged)."""
    if vm.lease_epoch is None:
        return False
    lease = Lease(vm.run_id, vm.node_id, vm.lease_epoch)
    for _ in range(3):
        run = await store.get_run(vm.run_id)  # for the run's log line
        if run is None or run.finished:
            return True
        count, head = await store.journal_head(vm.run_id)
        w = EventWriter(vm.run_id, count, head) if head else EventWriter(vm.run_id, count)
        events = (terminated(w, vm), w.event(ev.RUN_CANCELLED, {"by": "request"}))
        batch = Append(lease, events, RunUpdate("cancelled", error=ev.CANCELLED))
        try:
            await commits.commit(store, batch, patience=ttl, run=run)
        except LeaseLost:
            return False
        except StoreUnavailable:
            raise
        except StoreError:
            continue  # a report of the VM landed at the same place first: read the head again
        return True
    return False
