"""The microVM tier's records and the store role that keeps them (docs/runtime.md).

Runtime nodes, the VMs placed on them, and named fenced leases (``run_locks`` generalised:
the same UPSERT that wins only an expired lease, the same epoch that fences a stale holder).
Every write the scheduler makes is conditional on its named lease's epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

VmState = Literal["scheduled", "starting", "running", "exited", "terminated"]
LIVE_VM_STATES: tuple[VmState, ...] = ("scheduled", "starting", "running")
SCHEDULER = "scheduler"  # the named lease of the scheduler leader


@dataclass(frozen=True)
class RuntimeNode:
    node_id: str
    driver: str
    capacity: int  # VMs at once
    memory_mb: int  # memory the node's VMs may take together
    labels: dict[str, str]
    started_at: datetime
    heartbeat_at: datetime
    lost_at: datetime | None = None
    running: int = 0  # live VMs placed on it
    memory_used_mb: int = 0

    def state(self, now: datetime, ttl: float) -> Literal["up", "lost"]:
        fresh = (now - self.heartbeat_at).total_seconds() <= ttl
        return "up" if fresh and self.lost_at is None else "lost"


@dataclass(frozen=True)
class Vm:
    vm_id: str
    run_id: str
    node_id: str
    driver: str
    attempt: int
    state: VmState
    memory_mb: int
    created_at: datetime
    resume: bool = False
    reason: str | None = None
    exit_code: int | None = None
    token_digest: str | None = field(default=None, repr=False)
    lease_epoch: int | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None

    @property
    def live(self) -> bool:
        return self.state in LIVE_VM_STATES


@dataclass(frozen=True)
class NamedLease:
    name: str
    holder: str
    epoch: int
    since: datetime
    expires_at: datetime


class RuntimeStore(Protocol):
    # runtime nodes
    async def register_node(self, node: RuntimeNode) -> None:
        """Insert or refresh a node (a node restarted under its id comes back up)."""

    async def heartbeat_node(self, node_id: str) -> None: ...

    async def node_stopped(self, node_id: str) -> None:
        """A node that stops cleanly says so: it is lost at once rather than after the TTL."""

    async def list_nodes(self) -> list[RuntimeNode]: ...

    # named leases
    async def acquire_named_lease(self, name: str, holder: str, ttl: float) -> NamedLease | None:
        """Win a free or expired named lease with a new epoch, or renew it for its holder
        (same epoch); None while another holds it."""

    async def get_named_lease(self, name: str) -> NamedLease | None: ...

    async def release_named_lease(self, lease: NamedLease) -> None: ...

    # VMs
    async def place_vm(self, leader: NamedLease, vm: Vm) -> bool:
        """Insert a placed VM, only while ``leader`` is the current, unexpired holder."""

    async def take_vm(self, vm_id: str, node_id: str, token_digest: str, lease_epoch: int) -> bool:
        """A node takes a VM placed on it (``scheduled`` -> ``starting``)."""

    async def set_vm_running(self, vm_id: str) -> bool: ...

    async def end_vm(
        self,
        vm_id: str,
        state: VmState,
        reason: str,
        exit_code: int | None,
        leader: NamedLease | None = None,
    ) -> bool:
        """A live VM ends; False when it had already ended (or ``leader`` is stale)."""

    async def get_vm(self, vm_id: str) -> Vm | None: ...

    async def run_vms(self, run_id: str) -> list[Vm]:
        """The run's VMs, oldest first."""

    async def node_vms(self, node_id: str, *, live: bool = True) -> list[Vm]: ...

    async def list_vms(self, *, limit: int = 100) -> list[Vm]:
        """The newest VMs first."""

    async def runs_needing_vm(self, limit: int) -> list[str]:
        """Unfinished microVM runs (their agent has a ``runtime`` block) with no live VM and
        no live lease, oldest first."""

    async def expire_lease_of(self, run_id: str, holder: str) -> None:
        """Expire the run's lease now if ``holder`` has it (a lost node holds it no more)."""
