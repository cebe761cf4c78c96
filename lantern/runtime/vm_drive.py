"""The control plane's drive for one live VM: its step ledger and its writer, in memory.

A VM's workload proposes (what its own ``ctx.step`` did) and asks (model calls, tools, waits);
the ``Relay`` decides through the run's ``Ledger`` (``lantern.engine.ledger``), the one every
kind of run asks, and writes through THE fenced commit on the run lease its runtime node
holds. The ledger is folded from the journal once, when the VM first asks something, and kept
current by the events it makes, so a call costs its fenced commits and the look at the VM's
row that authenticates it, not a read and a fold of the whole journal. The agent's budget and
the output limit are the ledger's, as in-process.

Steps are observed as an in-process drive's are: a step the control plane performs for the VM
(a model call, a tool) runs through ``perform`` (its span, duration, timeout, and the one
mapping of what it raised to its StepError); a step the workload's own code ran gets its span
and duration from when the control plane let its attempt start to its reported outcome
(``begun``, ``reported``), in the run's trace. Anomaly detection is an in-process drive's too
(``notice``: the agent's ``anomalies`` settings, this process's retry rates and baselines);
a VM has nowhere to park, so a ``pause`` policy is recorded, and a ``fail`` fails the run.

While a VM lives, only the control plane that serves it writes its run's journal: a cancel and
the scheduler's reconciliation end the VM's row before they write (then the VM's next request
is refused, 409). A commit that lost that race lands at a place the journal already holds and
is refused; the drive is then dropped and folded afresh from the journal, which says whether
the VM may go on.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from lantern.engine import commits
from lantern.engine.anomalies import Detector, RetryRates, settings, signature
from lantern.engine.baselines import Baselines
from lantern.engine.drive import performed
from lantern.engine.graph import parse_agent
from lantern.engine.ledger import Ledger
from lantern.engine.microvm import MicroVmAgent
from lantern.errors import Conflict, DefinitionError, LeaseLost, StoreError, StoreUnavailable
from lantern.limits import MAX_OUTPUT_BYTES
from lantern.models.budget import Budget
from lantern.observability import metrics, tracing
from lantern.store.base import Store
from lantern.store.records import Append, Lease, NewEvent, Run, RunUpdate
from lantern.store.runtime import Vm

MAX_DRIVES = 1000  # live VMs whose drives one control plane keeps in memory
MAX_AGENTS = 1000  # agent versions whose runtime settings are kept in memory


@dataclass
class VmDrive:
    vm: Vm
    run: Run
    ledger: Ledger
    detector: Detector  # anomalies: what the journal holds, then each commit's events
    agent: MicroVmAgent | None = None  # the run's agent version (budget, anomalies)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one decision at a time
    # (step, attempt) -> when the VM was told to run it (epoch ns, perf_counter s)
    running: dict[tuple[str, int], tuple[int, float]] = field(default_factory=dict)

    @property
    def lease(self) -> Lease:
        assert self.vm.lease_epoch is not None
        return Lease(self.vm.run_id, self.vm.node_id, self.vm.lease_epoch)

    def perform(
        self, step: str, attempt: int, step_type: str, work: Awaitable[Any]
    ) -> asyncio.Task[Any]:
        """A step the control plane performs for the VM, as every drive performs one."""
        with tracing.in_run(self.run.id):
            return performed(work, step, step_type, attempt)

    async def notice(self, events: list[NewEvent]) -> dict[str, Any] | None:
        """Journal (into ``events``) the anomalies that ``events``, about to be committed,
        raise, each policy applied as for a kind of run that cannot park: the run's error
        when one fails it."""
        starting = [signature(e.step_id or "", e.data) for e in events if e.kind == "step_started"]
        found = await self.detector.check(events, starting)
        if not found:
            return None
        noted, error, _ = self.ledger.anomalies(found, can_pause=False)
        events += noted
        return error

    def begun(self, step: str, attempt: int) -> None:
        """The VM was told to run attempt ``attempt`` of its own step ``step``."""
        self.running[(step, attempt)] = (time.time_ns(), time.perf_counter())

    def reported(self, step: str, attempt: int, outcome: Any) -> None:
        """The VM reported how its own step's attempt ended: its span and duration (from
        ``begun``; a drive folded afresh meanwhile knows no start: a zero-length span)."""
        started = self.running.pop((step, attempt), None)
        at, clock = started if started is not None else (time.time_ns(), time.perf_counter())
        metrics.step_duration("step", time.perf_counter() - clock)
        tracing.reported_step(self.run.id, step, "step", attempt, at, outcome)


class Drives:
    """The drives of the VMs this control plane serves, by VM id."""

    def __init__(
        self,
        store: Store,
        *,
        listeners: Sequence[commits.Listener] = (),
        patience: float = 60.0,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
        retry_rates: RetryRates | None = None,
        baselines: Baselines | None = None,
    ) -> None:
        self.store = store
        # Shared with the process's in-process runs when it has them (lantern serve).
        self.retry_rates = retry_rates or RetryRates()
        self.baselines = baselines or Baselines(store)
        self.listeners = listeners
        self.patience = patience
        self.max_output_bytes = max_output_bytes
        self._drives: OrderedDict[str, VmDrive] = OrderedDict()
        self._loading: dict[str, asyncio.Lock] = {}
        self._agents: OrderedDict[tuple[str, str, int], MicroVmAgent | None] = OrderedDict()

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
            agent = await self._agent(run)
            journal = await self.store.events(vm.run_id, blobs=True)
            ledger = Ledger.fold(
                vm.run_id,
                journal,
                budget=None if agent is None else Budget.from_json(agent.budget),
                max_output=self.max_output_bytes,
            )
            limits = dict(settings({}) if agent is None else agent.anomalies)
            baselines, workspace, name = self.baselines, run.workspace, run.agent_name

            async def baseline() -> dict[str, list[Any]]:
                return await baselines.of(workspace, name)

            detector = Detector(workspace, limits, self.retry_rates, baseline)
            detector.replay(journal)
            made = VmDrive(vm, run, ledger, detector, agent)
            self._drives[vm.vm_id] = made
            while len(self._drives) > MAX_DRIVES:
                self._drives.popitem(last=False)
        self._loading.pop(vm.vm_id, None)
        return made

    async def _agent(self, run: Run) -> MicroVmAgent | None:
        """The run's agent version (a version never changes: kept in memory)."""
        key = (run.workspace, run.agent_name, run.agent_version)
        if key not in self._agents:
            found = await self.store.get_agent(*key)
            agent = None
            if found is not None:
                with suppress(DefinitionError):
                    agent = parse_agent(found.definition)
            self._agents[key] = agent if isinstance(agent, MicroVmAgent) else None
            while len(self._agents) > MAX_AGENTS:
                self._agents.popitem(last=False)
        return self._agents[key]

    def held(self, vm_id: str) -> Vm | None:
        """The row of a VM whose drive is held here, as it was when last read (live then)."""
        found = self._drives.get(vm_id)
        return None if found is None else found.vm

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
            drive.detector.replay(events)
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
