"""Plain records the store reads and writes. The store knows nothing of graphs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from lantern.statuses import TERMINAL as TERMINAL
from lantern.statuses import RunStatus as RunStatus

ACTIVE: tuple[RunStatus, ...] = ("queued", "running")


@dataclass(frozen=True)
class AgentVersion:
    workspace: str
    name: str
    version: int
    definition: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class RunUsage:
    """What a run's model calls spent: summed from the journal's ``step_completed`` events
    that carry ``usage``, by the database in the transaction that writes them."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    model_calls: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: RunUsage) -> RunUsage:
        return RunUsage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cost_usd + other.cost_usd,
            self.model_calls + other.model_calls,
        )

    def to_json(self) -> dict[str, int | float]:
        return {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "costUsd": round(self.cost_usd, 10),
            "modelCalls": self.model_calls,
        }


@dataclass(frozen=True)
class RunFlow:
    """What a run of an agent under flow control is claimed by (docs/flow-control.md): its
    rendered concurrency ``key`` (``""`` when the agent sets only maxConcurrentRuns), the
    agent's ``limit`` per key and its ``max_runs`` (maxConcurrentRuns), as at the run's create."""

    key: str
    limit: int | None
    max_runs: int | None


# What a create asks of the agent version it pins: that version's ``concurrency`` and
# ``maxConcurrentRuns`` (None when absent) and the run's input, to the flow it runs under.
FlowOf = Callable[[Any, Any], "RunFlow | None"]


@dataclass(frozen=True)
class Run:
    id: str
    workspace: str
    agent_name: str
    agent_version: int
    status: RunStatus
    input: Any
    output: Any
    error: Any
    created_at: datetime
    updated_at: datetime
    cancel_requested: bool = False
    parent_id: str | None = None  # the run whose subagent step started this one
    usage: RunUsage = field(default_factory=RunUsage)
    # A code-first run parked because the replica that had it lacks this version of its code.
    waiting_for: str | None = None
    priority: int = 5  # 0-9: among runs that may start, higher first
    flow: RunFlow | None = None  # None: the agent has no flow control

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class RunDetail:
    """A run with what its API answer shows beside it, read with it in one query."""

    run: Run
    children: list[str]  # the ids of the runs its sub-agent steps started, by id
    idempotency_key: str | None  # the key it was created under (a schedule's fire has one)


@dataclass(frozen=True)
class ApiKey:
    """An API key as stored: the secret itself is never kept, only its SHA-256."""

    id: str
    workspace: str
    secret_hash: str
    scopes: frozenset[str]
    created_at: datetime
    revoked_at: datetime | None = None
    name: str | None = None  # a person's or a service's label, shown where the key acts


@dataclass(frozen=True)
class Lease:
    """The right to write a run's journal, for as long as ``epoch`` is the current one."""

    run_id: str
    worker_id: str
    epoch: int


DeliveryStatus = Literal["claimed", "delivered", "failed"]


@dataclass(frozen=True)
class Delivery:
    """A side_effect_receipts row: one named delivery of one step, claimed before dispatch."""

    run_id: str
    step_id: str
    name: str
    attempt: int
    idempotency_key: str
    kind: str  # email, http, tool, ...
    target: str | None
    status: DeliveryStatus = "claimed"
    response: Any = None  # the receiver's answer, or the error
    claimed_at: datetime | None = None
    completed_at: datetime | None = None


@dataclass(frozen=True)
class Orphan:
    """A run found with no live lease, and the lease a sweep stole for it (None: lost race)."""

    run_id: str
    lease: Lease | None
    previous_worker: str | None
    expired_at: datetime | None  # when the previous lease ran out; None when there was none


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None
    runs: tuple[str, ...]  # the runs it holds live leases on


@dataclass(frozen=True)
class Blob:
    """A large payload stored once, content-addressed, and referenced from events."""

    digest: str
    body: bytes


@dataclass(frozen=True)
class NewEvent:
    seq: int
    kind: str
    at: datetime
    data: dict[str, Any] = field(default_factory=dict)
    step_id: str | None = None
    node_id: str | None = None
    attempt: int | None = None
    blob: Blob | None = None
    hash: str | None = None  # chained to the previous event's (lantern.engine.chain)


@dataclass(frozen=True)
class Event:
    run_id: str
    seq: int
    kind: str
    at: datetime
    data: dict[str, Any]
    step_id: str | None
    node_id: str | None
    attempt: int | None
    blob_digest: str | None = None
    # Filled only by reads that ask for blobs (a re-drive); listings stay small.
    blob: bytes | None = None
    hash: str | None = None


@dataclass(frozen=True)
class RunUpdate:
    """Run columns changed by an append, written in the same transaction as its events."""

    status: RunStatus
    output: Any = None
    error: Any = None
    # A parked (waiting) run is claimed again at this time even if nothing wakes it sooner.
    wake_at: datetime | None = None
    # A code-first run parked for a version of its code that this replica lacks (no wake_at:
    # a replica that has the version adopts it).
    waiting_for: str | None = None

    @property
    def releases(self) -> bool:
        """A finished or parked run gives its lease up in the same transaction."""
        return self.status in TERMINAL or self.status == "waiting"


@dataclass(frozen=True)
class Append:
    """One writer's events for one run, fenced by its lease."""

    lease: Lease
    events: tuple[NewEvent, ...]
    update: RunUpdate | None = None

    @property
    def finishes(self) -> bool:
        """The append ends the run (its waiters for the end can read it now)."""
        return self.update is not None and self.update.status in TERMINAL


@dataclass(frozen=True)
class Decision:
    """A human's (or a timeout's) answer at an approval: stored once per run and node."""

    run_id: str
    node_id: str
    decision: Literal["approved", "rejected"]
    decided_by: str
    comment: str | None = None
    decided_at: datetime | None = None
    decided_by_name: str | None = None  # the deciding key's name, when it has one


@dataclass(frozen=True)
class SigningKey:
    """A receipt signing key's public half, as registered: every replica serves every key."""

    kid: str  # the RFC 7638 JWK thumbprint
    x: str  # the Ed25519 public key, base64url without padding
    created_at: datetime


@dataclass(frozen=True)
class SecretInfo:
    """A workspace secret as anyone may see it: its name and times, never its value."""

    name: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class SealedSecret:
    """A secret as stored: ciphertext and the id of the key that sealed it."""

    name: str
    key_id: str
    sealed: bytes = field(repr=False)


@dataclass(frozen=True)
class StoredReceipt:
    """A run's signed receipt. ``body`` is the receipt's canonical JSON, the signed bytes."""

    run_id: str
    key_id: str
    body: str
    signature: str  # base64url without padding
    created_at: datetime | None = None


@dataclass(frozen=True)
class PendingApproval:
    """An approval a run waits on and nobody has decided yet."""

    run_id: str
    node_id: str
    agent_name: str
    prompt: str | None
    since: datetime


@dataclass(frozen=True)
class RunGauges:
    """What /metrics reports at each scrape: unfinished runs, live leases, the queue's age."""

    runs: dict[tuple[str, str], int]  # (workspace, status) -> runs queued, running or waiting
    leases_held: int
    oldest_queued: datetime | None  # when the longest-queued run was created
