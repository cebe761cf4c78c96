"""The scheduler: one leader among the ``lantern serve`` replicas places VMs and reconciles them.

Leadership is the named fenced lease ``scheduler`` (``run_locks`` generalised): the leader
renews it every tick, a replica that finds it expired takes it with a new epoch, and every
placement and reconciliation write is conditional on that epoch, so a paused ex-leader cannot
place a thing. Each tick the leader

1. marks the VMs of runtime nodes whose heartbeat is older than ``LANTERN_NODE_TTL``
   ``terminated`` (reason ``node_lost``), journaling ``vm_terminated``, and resumes their runs;
2. places every microVM run that has no live VM and no live lease (resumeMicroVMRun), fairly
   between workspaces: one run of each waiting workspace in turn (oldest first within one), and
   a workspace that holds ``LANTERN_VM_WORKSPACE_SLOTS`` live VMs (default: half the capacity of
   the runtime nodes that are up, at least 1) gets no more while another workspace waits. So
   one tenant's hundred queued runs, or its parked VMs, cannot hold every slot of the cluster.

Placement is durable before any node acts on it: ``vm_scheduled`` is journaled (fenced on the
run lease), then the ``runtime_vms`` row is inserted (fenced on the leader's epoch); a runtime
node starts only VMs whose row it finds, and the database refuses a second live VM per run.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lantern.engine import commits
from lantern.engine import events as ev
from lantern.engine.graph import parse_agent
from lantern.engine.microvm import MAX_RESUME_ATTEMPTS, MicroVmAgent
from lantern.errors import DefinitionError, LeaseLost
from lantern.runtime import metrics
from lantern.runtime.journal import vm_data, writer
from lantern.store.base import Store
from lantern.store.records import Append, Lease, NewEvent, Run, RunUpdate
from lantern.store.runtime import LIVE_VM_STATES, SCHEDULER, NamedLease, RuntimeNode, Vm

log = logging.getLogger("lantern.scheduler")

BATCH = 20
WAITING_LOOKED_AT = 200  # the oldest waiting runs fairness chooses among, per tick


def fair_order(waiting: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """``(run id, workspace)`` pairs, oldest first, interleaved one per workspace in turn:
    the first run of each workspace (in the order of their oldest), then the second..."""
    queues: dict[str, list[tuple[str, str]]] = {}
    for item in waiting:
        queues.setdefault(item[1], []).append(item)
    order: list[tuple[str, str]] = []
    depth = 0
    while len(order) < len(waiting):
        for queue in queues.values():
            if depth < len(queue):
                order.append(queue[depth])
        depth += 1
    return order


@dataclass(frozen=True)
class Waiting:
    run_id: str
    reason: str


def choose(
    nodes: Sequence[RuntimeNode], agent: MicroVmAgent, avoid: str | None, now: datetime, ttl: float
) -> tuple[RuntimeNode | None, str]:
    """The runtime node for a VM of ``agent`` (another than ``avoid`` where one is up), or
    None and why the run waits."""
    up = [n for n in nodes if n.state(now, ttl) == "up"]
    if not up:
        return None, "no runtime node is up"
    fit = [n for n in up if agent.driver in ("auto", n.driver)]
    if not fit:
        drivers = ", ".join(sorted({n.driver for n in up}))
        return None, f"no runtime node runs driver {agent.driver!r} (up nodes run: {drivers})"
    big = [n for n in fit if n.memory_mb >= agent.memory_mb]
    if not big:
        return None, f"memoryMb {agent.memory_mb} is above every runtime node's memory"
    room = [
        n
        for n in big
        if n.running < n.capacity and n.memory_used_mb + agent.memory_mb <= n.memory_mb
    ]
    if not room:
        return None, "every runtime node that fits the VM is full"
    others = [n for n in room if n.node_id != avoid] or room
    return min(others, key=lambda n: (n.running / n.capacity, n.node_id)), ""


class Scheduler:
    def __init__(
        self,
        store: Store,
        *,
        worker_id: str,
        node_ttl: float,
        lease_ttl: float,
        workspace_slots: int = 0,
        tick: float | None = None,
        listeners: Sequence[commits.Listener] = (),
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.node_ttl = node_ttl
        self.lease_ttl = lease_ttl
        self.tick_every = tick if tick is not None else min(1.0, node_ttl / 5)
        self.listeners = listeners
        self.workspace_slots = workspace_slots  # 0: half the up nodes' capacity, at least 1
        self._workspaces: dict[str, str] = {}  # run id -> its workspace (it never changes)
        self.leader: NamedLease | None = None
        self.waiting: dict[str, str] = {}  # run id -> why it has no VM yet
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()

    # -- the loop --------------------------------------------------------------------------

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await self.tick()
            except Exception as exc:  # the database is away: the next tick tries again
                log.warning("scheduler tick failed: %s", exc)
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.tick_every)
            self._wake.clear()
        if self.leader is not None:
            with suppress(Exception):
                await self.store.release_named_lease(self.leader)
            self.leader = None
            metrics.LEADER.set(0)

    def wake(self) -> None:
        self._wake.set()

    async def tick(self) -> None:
        lease = await self.store.acquire_named_lease(SCHEDULER, self.worker_id, self.node_ttl)
        if lease is None:
            if self.leader is not None:
                log.warning("replica %s no longer leads the scheduler", self.worker_id)
            self.leader = None
            metrics.LEADER.set(0)
            return
        if self.leader is None or self.leader.epoch != lease.epoch:
            log.info("replica %s leads the scheduler (epoch %d)", self.worker_id, lease.epoch)
        self.leader = lease
        metrics.LEADER.set(1)
        await self.reconcile()
        vms = await self.store.list_vms(limit=1000)
        await self._place_fairly(vms)
        vms = await self.store.list_vms(limit=1000)
        for state in (*LIVE_VM_STATES, "exited", "terminated"):
            metrics.VMS.labels(state).set(sum(1 for v in vms if v.state == state))

    async def _workspace(self, run_id: str) -> str | None:
        found = self._workspaces.get(run_id)
        if found is None:
            run = await self.store.get_run(run_id)
            if run is None:
                return None
            found = self._workspaces[run_id] = run.workspace
        return found

    async def _place_fairly(self, vms: Sequence[Vm]) -> None:
        waiting: list[tuple[str, str]] = []
        for run_id in await self.store.runs_needing_vm(WAITING_LOOKED_AT):
            workspace = await self._workspace(run_id)
            if workspace is not None:
                waiting.append((run_id, workspace))
        if not waiting:
            return
        live: dict[str, int] = {}
        for vm in vms:
            if vm.live:
                workspace = await self._workspace(vm.run_id)
                if workspace is not None:
                    live[workspace] = live.get(workspace, 0) + 1
        slots = self.workspace_slots or await self._default_slots()
        waiting_in = {workspace for _, workspace in waiting}
        placed = 0
        for run_id, workspace in fair_order(waiting):
            if placed >= BATCH:
                break
            if live.get(workspace, 0) >= slots and waiting_in - {workspace}:
                self.waiting[run_id] = (
                    f"its workspace holds {live[workspace]} live VMs "
                    f"(LANTERN_VM_WORKSPACE_SLOTS {slots}) while another workspace waits"
                )
                continue
            run_lease = await self.store.acquire_lease(run_id, self.worker_id, self.lease_ttl)
            if run_lease is None:
                continue
            if await self._placing(run_id, run_lease) is not None:
                placed += 1
                live[workspace] = live.get(workspace, 0) + 1
        for run_id in list(self._workspaces)[: -WAITING_LOOKED_AT * 10 or None]:
            del self._workspaces[run_id]  # bounded: the oldest go first

    async def _default_slots(self) -> int:
        now = datetime.now(UTC)
        up = [n for n in await self.store.list_nodes() if n.state(now, self.node_ttl) == "up"]
        return max(1, sum(n.capacity for n in up) // 2)

    def leading(self) -> NamedLease | None:
        lease = self.leader
        if lease is None or lease.expires_at <= datetime.now(UTC):
            return None
        return lease

    async def reconcile(self) -> None:
        """The VMs of lost runtime nodes are terminated (node_lost) and their runs resumed."""
        now = datetime.now(UTC)
        for node in await self.store.list_nodes():
            if node.running and node.state(now, self.node_ttl) == "lost":
                for vm in await self.store.node_vms(node.node_id):
                    await self.lose(vm, "node_lost")

    async def lose(self, vm: Vm, reason: str) -> None:
        leader = self.leading()
        if leader is None:
            return
        # The lost node's lease on the run goes now (its epoch stays, so it stays fenced).
        await self.store.expire_lease_of(vm.run_id, vm.node_id)
        lease = await self.store.acquire_lease(vm.run_id, self.worker_id, self.lease_ttl)
        if lease is None:
            return
        try:
            run = await self.store.get_run(vm.run_id)
            if run is not None and not run.finished:
                w = await writer(self.store, vm.run_id)
                data = vm_data(vm, exitCode=None, reason=reason)
                await self._commit(lease, [w.event(ev.VM_TERMINATED, data)], None, run)
            if await self.store.end_vm(vm.vm_id, "terminated", reason, None, leader):
                metrics.VM_ENDS.labels(reason).inc()
                log.warning("VM %s of run %s on %s: %s", vm.vm_id, vm.run_id, vm.node_id, reason)
            if run is not None and not run.finished:
                await self.resume(run, lease)
        except LeaseLost:
            return
        finally:
            await self.store.release_lease(lease)

    async def _placing(self, run_id: str, lease: Lease) -> Vm | None:
        try:
            run = await self.store.get_run(run_id)
            if run is not None:
                return await self.resume(run, lease)
        except LeaseLost:
            pass
        finally:
            await self.store.release_lease(lease)
        return None

    # -- resumeMicroVMRun --------------------------------------------------------------------

    async def adopt(self, run: Run, lease: Lease) -> None:
        """What the dispatcher and the recovery sweep do with a microVM run they hold: resume
        it here if this replica leads, else make it wait for the leader. Releases ``lease``."""
        try:
            if self.leading() is not None:
                await self.resume(run, lease)
            else:
                await self.resume(run, lease, place=False)
                self.wake()
        except LeaseLost:
            pass
        finally:
            await self.store.release_lease(lease)

    async def resume(self, run: Run, lease: Lease, *, place: bool = True) -> Vm | None:
        """resumeMicroVMRun: a live VM -> skip; 3 VMs or more -> the run fails with
        ``microvm_resume_exhausted``; else a new VM, with LANTERN_RESUME=1 after the first."""
        async with self._lock:
            return await self._resume(run, lease, place)

    async def _resume(self, run: Run, lease: Lease, place: bool) -> Vm | None:
        run = await self.store.get_run(run.id) or run
        if run.finished:
            return None
        vms = await self.store.run_vms(run.id)
        if any(v.live for v in vms):
            return None  # the VM is self-managing
        w = await writer(self.store, run.id)
        if run.cancel_requested:  # a cancel came while no VM held the run: never place one
            cancelled = w.event(ev.RUN_CANCELLED, {"by": "request"})
            await self._commit(lease, [cancelled], RunUpdate("cancelled", error=ev.CANCELLED), run)
            self.waiting.pop(run.id, None)
            return None
        events: list[NewEvent] = []
        update: RunUpdate | None = None
        if run.status == "queued":
            events.append(w.event(ev.RUN_STARTED, {"worker": self.worker_id, "tier": "microvm"}))
            update = RunUpdate("running")
        if len(vms) >= MAX_RESUME_ATTEMPTS:
            error = ev.run_error(
                ev.E_MICROVM_EXHAUSTED,
                f"the run lost {len(vms)} VMs; it is not resumed again",
                attempts=len(vms),
            )
            events.append(w.event(ev.RUN_FAILED, {"error": error}))
            await self._commit(lease, events, RunUpdate("failed", error=error), run)
            metrics.EXHAUSTED.inc()
            self.waiting.pop(run.id, None)
            return None
        agent = await self._agent(run)
        if agent is None:
            error = ev.run_error("definition", "the agent has no valid runtime block")
            events.append(w.event(ev.RUN_FAILED, {"error": error}))
            await self._commit(lease, events, RunUpdate("failed", error=error), run)
            return None
        leader = self.leading()
        node: RuntimeNode | None = None
        if place and leader is not None:
            now = datetime.now(UTC)
            avoid = vms[-1].node_id if vms else None
            node, why = choose(await self.store.list_nodes(), agent, avoid, now, self.node_ttl)
            if node is None:
                self.waiting[run.id] = why
        if node is None or leader is None:
            if events:  # journal the start, so the dispatcher stops claiming a queued run
                await self._commit(lease, events, update, run)
            return None
        attempt = len(vms) + 1
        vm = Vm(
            vm_id=f"vm_{run.id.removeprefix('run_')[:12]}{secrets.token_hex(4)}",
            run_id=run.id,
            node_id=node.node_id,
            driver=node.driver,
            attempt=attempt,
            state="scheduled",
            memory_mb=agent.memory_mb,
            created_at=datetime.now(UTC),
            resume=attempt > 1,
        )
        data = vm_data(vm, driver=vm.driver, resume=vm.resume, memoryMb=vm.memory_mb)
        events.append(w.event(ev.VM_SCHEDULED, data))
        await self._commit(lease, events, update, run)
        if not await self.store.place_vm(leader, vm):
            log.warning("placement of %s for run %s refused (no longer leader?)", vm.vm_id, run.id)
            return None
        self.waiting.pop(run.id, None)
        if vm.resume:
            metrics.RESUMES.inc()
        log.info("placed %s (attempt %d) of run %s on %s", vm.vm_id, attempt, run.id, node.node_id)
        return vm

    async def _commit(
        self, lease: Lease, events: list[NewEvent], update: RunUpdate | None, run: Run
    ) -> None:
        """THE fenced commit (``lantern.engine.commits``), on the run lease held here."""
        batch = Append(lease, tuple(events), update)
        await commits.commit(
            self.store, batch, patience=self.lease_ttl, listeners=self.listeners, run=run
        )

    async def _agent(self, run: Run) -> MicroVmAgent | None:
        found = await self.store.get_agent(run.workspace, run.agent_name, run.agent_version)
        if found is None:
            return None
        try:
            # No model routes: a microVM definition names no model (its code calls ctx.model,
            # checked when the call arrives), and any other kind is not placed here.
            agent = parse_agent(found.definition)
        except DefinitionError:
            return None
        return agent if isinstance(agent, MicroVmAgent) else None

    def status(self) -> dict[str, Any]:
        return {"waiting": [{"runId": r, "reason": why} for r, why in self.waiting.items()]}
