"""The control plane's drive for one live VM: its step ledger and its writer, in memory.

A VM's workload proposes (what its own ``ctx.step`` did) and asks (model calls, tools, waits);
the ``Relay`` decides through the run's ``Ledger`` (``lantern.engine.ledger``), the one every
kind of run asks, and writes through THE fenced commit on the run lease its runtime node
holds. The ledger is folded from the journal once, when the VM first asks something, and kept
current by the events it makes, so a call costs its fenced commits and the look at the VM's
row that authenticates it, not a read and a fold of the whole journal.

While a VM lives, only the control plane that serves it writes its run's journal: a cancel and
the scheduler's reconciliation end the VM's row before they write (then the VM's next request
is refused, 409). A commit that lost that race lands at a place the journal already holds and
is refused; the drive is then dropped and folded afresh from the journal, which says whether
the VM may go on.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from lantern.engine import commits
from lantern.engine.ledger import Ledger
from lantern.errors import Conflict, LeaseLost, StoreError, StoreUnavailable
from lantern.store.base import Store
from lantern.store.records import Append, Lease, NewEvent, Run, RunUpdate
from lantern.store.runtime import Vm

MAX_DRIVES = 1000  # live VMs whose drives one control plane keeps in memory


@dataclass
class VmDrive:
    vm: Vm
    run: Run
    ledger: Ledger
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one decision at a time

    @property
    def lease(self) -> Lease:
        assert self.vm.lease_epoch is not None
        return Lease(self.vm.run_id, self.vm.node_id, self.vm.lease_epoch)


class Drives:
    """The drives of the VMs this control plane serves, by VM id."""

    def __init__(
        self,
        store: Store,
        *,
        listeners: Sequence[commits.Listener] = (),
        patience: float = 60.0,
    ) -> None:
        self.store = store
        self.listeners = listeners
        self.patience = patience
        self._drives: OrderedDict[str, VmDrive] = OrderedDict()
        self._loading: dict[str, asyncio.Lock] = {}

    async def get(self, vm: Vm) -> VmDrive:
        """``vm``'s drive (``vm``: its row as just read, live), folded from the journal the
        first time."""
        found = self._drives.get(vm.vm_id)
        if found is not None and found.vm.lease_epoch == vm.lease_epoch:
            self._drives.move_to_end(vm.vm_id)
            return found
        lock = self._loading.setdefault(vm.vm_id, asyncio.Lock())
        async with lock:
            found = self._drives.get(vm.vm_id)
            if found is not None and found.vm.lease_epoch == vm.lease_epoch:
                return found
            run = await self.store.get_run(vm.run_id)
            if run is None:
                raise Conflict(f"run {vm.run_id} is gone")
            ledger = Ledger.fold(vm.run_id, await self.store.events(vm.run_id, blobs=True))
            made = VmDrive(vm, run, ledger)
            self._drives[vm.vm_id] = made
            while len(self._drives) > MAX_DRIVES:
                self._drives.popitem(last=False)
        self._loading.pop(vm.vm_id, None)
        return made

    def drop(self, vm_id: str) -> None:
        """Forget a VM's drive: it ended, or its ledger ran ahead of the journal."""
        self._drives.pop(vm_id, None)

    async def commit(
        self, drive: VmDrive, events: Sequence[NewEvent], update: RunUpdate | None = None
    ) -> None:
        """THE fenced commit of events ``drive``'s ledger made; 409 when the VM's node no
        longer holds the run or another writer came first (the drive is dropped then: its
        ledger already counts events the journal refused)."""
        try:
            await commits.commit(
                self.store,
                Append(drive.lease, tuple(events), update),
                patience=self.patience,
                listeners=self.listeners,
                run=drive.run,
            )
        except LeaseLost as exc:
            self.drop(drive.vm.vm_id)
            message = f"VM {drive.vm.vm_id} no longer holds run {drive.vm.run_id}: {exc}"
            raise Conflict(message) from exc
        except StoreUnavailable:
            self.drop(drive.vm.vm_id)
            raise
        except StoreError as exc:  # another writer's events are where ours were to go
            self.drop(drive.vm.vm_id)
            raise Conflict(f"run {drive.vm.run_id} was written meanwhile: {exc}") from exc
        except BaseException:
            self.drop(drive.vm.vm_id)
            raise
