"""The narrow store interface every backend implements, and the factory that picks one."""

from __future__ import annotations

from collections.abc import Container, Sequence
from datetime import datetime
from typing import Any, Protocol

from lantern.store.model_limits import ModelLimitStore
from lantern.store.notify import Notifier
from lantern.store.records import (
    AgentVersion,
    ApiKey,
    Append,
    Decision,
    Delivery,
    DeliveryStatus,
    Event,
    FlowOf,
    Lease,
    NewEvent,
    Orphan,
    PendingApproval,
    Run,
    RunDetail,
    RunGauges,
    RunStatus,
    RunUpdate,
    RunUsage,
    SealedSecret,
    SecretInfo,
    SigningKey,
    StoredReceipt,
    WorkerInfo,
)
from lantern.store.retention import RetentionStore
from lantern.store.runtime import RuntimeStore
from lantern.store.schedules import ScheduleStore
from lantern.store.signals import SignalStore


class JournalStore(Protocol):
    """A run's journal: the fenced writes every drive makes, its reads, and the claimed
    deliveries of its steps (fenced by the same lease)."""

    # Told of every journal write after it commits (append, start_run, and any other method
    # that writes journal events must call ``notifier.committed``); see lantern.store.notify.
    notifier: Notifier

    async def start_run(
        self,
        run_id: str,
        worker_id: str,
        ttl: float,
        events: Sequence[NewEvent],
        update: RunUpdate,
    ) -> Lease | None:
        """Lease a queued run with no journal and write its opening events, in one transaction.

        None, with nothing written, when the run has started or another worker holds it.
        """

    async def start_new_run(
        self,
        run: Run,
        *,
        idempotency_key: str | None,
        request_digest: str | None,
        flow: FlowOf | None,
        worker_id: str,
        ttl: float,
        events: Sequence[NewEvent],
        update: RunUpdate,
        max_queued: int | None = None,
    ) -> tuple[Run, Lease | None]:
        """``create_run`` and ``start_run`` in one transaction (one commit where a create its
        replica drives at once made two): the run as stored (its status ``update``'s when
        started) and its lease. Started only when the version pinned is ``run.agent_version``
        (the one its opening was made for) and it is under no flow control (a claim alone
        counts those slots); else stored queued, nothing more written, and no lease. Raises
        as ``create_run`` does, with nothing stored.

        ``max_queued``: a run started here never waits in its workspace's queue, so only one
        stored queued is counted against that limit, in the same transaction: with
        ``max_queued`` or more other runs of its workspace queued, nothing is stored and
        QueueFull is raised (the creator decides what a full queue answers)."""

    async def append(self, batch: Append) -> None:
        """Write events and the run update in one transaction, or raise LeaseLost.

        An update to a finished status also releases the lease, in the same transaction.
        """

    async def events(
        self, run_id: str, *, after: int = 0, limit: int | None = None, blobs: bool = False
    ) -> list[Event]:
        """The run's journal in sequence order after ``after``, at most ``limit`` events, in
        one indexed query (a page's cost does not depend on where it starts)."""

    async def journal_head(self, run_id: str) -> tuple[int, str | None]:
        """How many events the run's journal holds, and the hash of the last one."""

    async def journal_heads(self, run_ids: Sequence[str]) -> dict[str, tuple[int, str | None]]:
        """``journal_head`` of each of ``run_ids`` (every one a key; ``(0, None)`` for a run
        with no events, or no run), in one query for the ids a receipt batch holds."""

    async def claim_delivery(self, lease: Lease, delivery: Delivery) -> Delivery:
        """Claim a delivery before dispatching it, fenced by the lease: insert it as claimed,
        or take over a failed one for this attempt; return the receipt as stored (a delivered
        or claimed one is returned unchanged). LeaseLost when the lease is gone."""

    async def finish_delivery(
        self, lease: Lease, delivery: Delivery, status: DeliveryStatus, response: Any
    ) -> None:
        """Record a claimed delivery's outcome, fenced by the lease."""

    async def deliveries(self, run_id: str) -> list[Delivery]:
        """A run's receipts, in the order they were claimed."""


class LeaseStore(Protocol):
    """Who executes which run: leases with epochs (the fence of every journal write),
    claims, orphan recovery, and the replicas' heartbeats."""

    async def acquire_lease(
        self, run_id: str, worker_id: str, ttl: float, *, reclaim: bool = True
    ) -> Lease | None:
        """Win a free or expired lease, or (``reclaim``) take back one this worker id holds,
        with a new epoch."""

    async def claim_runs(
        self,
        worker_id: str,
        ttl: float,
        limit: int,
        statuses: tuple[RunStatus, ...],
        *,
        skip: Container[str] = frozenset(),
    ) -> list[Lease]:
        """Lease up to ``limit`` runs in ``statuses`` with no live lease, oldest first.
        ``skip``: queued runs not to take (the caller is starting them itself)."""

    async def claim_run(self, run_id: str, worker_id: str, ttl: float) -> Lease | None:
        """Lease one queued or parked run, as the claim would: under the claim's lock, and
        for a run under flow control only while its key's and its agent's limits leave it a
        slot after the runs of its key queued before it (lantern/store/claims.py ``admits``).
        None when it may not start now, or has a live lease, or is not queued or waiting.
        For a start that is not a replica's claim: a run the CLI executes in its own process,
        a parked code-first run adopted by a replica that has its version."""

    async def recover_orphans(self, worker_id: str, ttl: float, limit: int) -> list[Orphan]:
        """Queued or running runs whose lease is absent or expired, oldest first, at most
        ``limit``: each with the lease this call stole for it, or None where another won."""

    async def runs_leased_by(self, worker_id: str) -> list[str]:
        """Unfinished runs whose lease (live or expired) names this worker id: queued or
        running, or parked and claimed (woken) but not opened yet."""

    async def renew_lease(self, lease: Lease, ttl: float) -> bool:
        """Extend the lease; False when its epoch is no longer current."""

    async def renew_leases(self, leases: Sequence[Lease], ttl: float) -> set[str]:
        """Extend many leases in one statement; the run ids whose epoch was still current."""

    async def release_lease(self, lease: Lease) -> None:
        """Expire the lease now (keeping its epoch, so a stale writer stays fenced)."""

    async def heartbeat(self, worker_id: str, started_at: datetime) -> None:
        """Record that the replica is alive (and when it started)."""

    async def worker_stopped(self, worker_id: str) -> None: ...

    async def list_workers(self) -> list[WorkerInfo]: ...


class RunStore(Protocol):
    """Agents and runs as the API and the engine see them: versions, runs, their control (a
    parked ``waiting`` run holds no lease; whatever resumes it sets its ``wake_at`` to now,
    and the dispatcher claims due parked runs like queued ones) and usage."""

    async def put_agent(
        self, workspace: str, name: str, definition: dict[str, Any]
    ) -> AgentVersion: ...

    async def get_agent(
        self, workspace: str, name: str, version: int | None = None
    ) -> AgentVersion | None: ...

    async def list_agents(
        self, workspace: str, *, limit: int = 1000, after: str | None = None
    ) -> list[AgentVersion]:
        """The newest version of each agent, by name; ``after`` is the last name seen."""

    async def create_run(
        self,
        run: Run,
        *,
        idempotency_key: str | None = None,
        request_digest: str | None = None,
        flow: FlowOf | None = None,
    ) -> Run:
        """Store a new run pinned to its agent's newest version, in one statement, and return
        it; raise NotFound for an unknown agent, Conflict when the key was already used.
        ``flow`` is given the pinned version's ``concurrency`` and ``maxConcurrentRuns`` (when
        it has either) and says what the run is claimed under (a second statement, for such
        an agent only); whatever it raises, no run is stored."""

    async def run_for_key(self, workspace: str, idempotency_key: str) -> tuple[Run, str] | None:
        """The run created with this key, and the digest of the request that created it."""

    async def request_cancel(self, run_id: str) -> bool:
        """Flag an unfinished run for cancellation; False when it had already finished."""

    async def cancel_requested(self, run_ids: Sequence[str]) -> set[str]:
        """Which of these runs have a cancellation request."""

    async def get_run(self, run_id: str) -> Run | None: ...

    async def get_runs(self, run_ids: Sequence[str]) -> dict[str, Run]:
        """The runs of ``run_ids`` that exist, by id (an unknown id is absent), in one query
        for the ids a receipt batch holds."""

    async def workspace_usage(self, workspace: str, since: datetime) -> RunUsage:
        """The model usage of the workspace's runs created at or after ``since``."""

    async def list_runs(
        self,
        workspace: str,
        *,
        status: RunStatus | None = None,
        agent_name: str | None = None,
        limit: int = 50,
        before: str | None = None,
    ) -> list[Run]:
        """Newest first (run ids sort by creation); ``before`` is the last id already seen."""

    async def decide(self, decision: Decision) -> bool:
        """Store the one decision at an approval and wake the run; False if one was made."""

    async def decisions(self, run_id: str) -> dict[str, Decision]:
        """The run's approval decisions by node id."""

    async def wake(self, run_id: str) -> None:
        """Make a parked run due now (no-op for a run that is not waiting)."""

    async def runs_waiting_for(self, agent_name: str, versions: Sequence[str]) -> list[str]:
        """Code-first runs of ``agent_name`` parked for one of ``versions`` of its code (by
        a replica that lacked it), at most 100."""

    async def children(self, run_id: str) -> list[Run]:
        """The runs the run's sub-agent steps started."""

    async def run_detail(self, run_id: str) -> RunDetail | None:
        """The run, its children's ids and its idempotency key in one query: what a read of
        the run through the API answers (``get_run``, ``children`` and ``run_key`` at once)."""

    async def runs_in_workspace(self, workspace: str, run_ids: Sequence[str]) -> set[str]:
        """Which of ``run_ids`` belong to ``workspace``."""

    # per-workspace limits (docs/security.md)
    async def queued_count(self, workspace: str, at_most: int) -> int:
        """How many of the workspace's runs are queued, counting no further than ``at_most``."""

    async def recent_step_usage(
        self, workspace: str, agent_name: str, runs: int = 50
    ) -> list[tuple[str, str, dict[str, Any]]]:
        """(run id, step id, output usage) of the steps that reported usage in the agent's
        newest ``runs`` succeeded runs: the baseline a cost or token spike is measured
        against."""


class KeyStore(Protocol):
    """API keys (stored hashed)."""

    async def create_api_key(self, key: ApiKey) -> None: ...

    async def get_api_key(self, key_id: str) -> ApiKey | None: ...

    async def list_api_keys(self, workspace: str | None = None) -> list[ApiKey]: ...

    async def revoke_api_key(self, key_id: str) -> bool:
        """False when there is no such live key."""


class SigningStore(Protocol):
    """Secrets and keys that sign: webhook signing secrets (one current per workspace, plus
    the one it replaced while that is in its overlap; kept in the clear, as signing needs
    the secret itself), and receipts with every key that ever signed one."""

    async def signing_secrets(self, workspace: str) -> list[str]:
        """The secrets to sign the workspace's deliveries with, newest first: the current one,
        then the previous one until its overlap ends. Empty when none is set."""

    async def ensure_signing_secret(self, workspace: str, secret: str) -> str:
        """Store ``secret`` as the workspace's secret unless it has one; return the current one
        (so concurrent first uses agree on a single secret)."""

    async def rotate_signing_secret(self, workspace: str, secret: str, overlap_s: float) -> None:
        """Make ``secret`` the current one; the one it replaces keeps signing for ``overlap_s``
        seconds more (0: it stops at once, for a leaked secret)."""

    async def register_signing_key(self, kid: str, x: str) -> None:
        """Record a receipt signing key's public half (nothing happens when it is known)."""

    async def signing_keys(self) -> list[SigningKey]:
        """Every registered receipt signing key, oldest first."""

    async def put_receipt(self, receipt: StoredReceipt) -> StoredReceipt:
        """Store the run's receipt unless it has one; return the one stored (so concurrent
        issuers agree on a single receipt)."""

    async def put_receipts(self, receipts: Sequence[StoredReceipt]) -> None:
        """Store each run's receipt unless it has one, all in one transaction (one commit for
        many runs); a run that has one keeps it, as with ``put_receipt``."""

    async def get_receipt(self, run_id: str) -> StoredReceipt | None: ...

    # operating runs across a workspace
    async def pending_approvals(self, workspace: str, limit: int = 500) -> list[PendingApproval]:
        """Approvals the workspace's unfinished runs wait on with no decision, oldest first."""

    async def gauges(self) -> RunGauges:
        """Unfinished runs by workspace and status, live leases, the oldest queued run."""

    async def create_retry(self, run: Run, events: Sequence[NewEvent]) -> Run:
        """Store a run pinned to ``run.agent_version``, parked and due now, with its opening
        events, in one transaction (so it is never seen without them)."""


class SecretStore(Protocol):
    """A workspace's secrets (docs/security.md), sealed by lantern.secrets before they get here:
    the store holds ciphertext and never sees a value."""

    async def put_secret(self, workspace: str, name: str, key_id: str, sealed: bytes) -> SecretInfo:
        """Create or replace the workspace's secret ``name``."""

    async def list_secrets(self, workspace: str) -> list[SecretInfo]:
        """The workspace's secrets by name: names and times only."""

    async def delete_secret(self, workspace: str, name: str) -> bool:
        """Delete one; False when the workspace has no such secret."""

    async def sealed_secrets(self, workspace: str) -> list[SealedSecret]:
        """The workspace's secrets as stored, for the executor to open."""


class Store(
    JournalStore,
    LeaseStore,
    RunStore,
    KeyStore,
    SigningStore,
    SecretStore,
    RuntimeStore,
    ScheduleStore,
    SignalStore,
    RetentionStore,
    ModelLimitStore,
    Protocol,
):
    """What the engine needs from a database, in the domain's words: the role Protocols above,
    which a part of the code may ask for alone (a drive needs a journal and leases).

    Invariants are the database's job: one ``step_completed`` per (run, step), one lease
    holder per run, and every journal write conditional on the writer's lease epoch.
    """

    url: str

    async def open(self) -> None:
        """Connect and apply pending migrations."""

    async def close(self) -> None: ...


def open_store(url: str) -> Store:
    """A store for a ``sqlite:///PATH`` or ``postgresql://...`` URL (not yet opened)."""
    if url.startswith("sqlite:"):
        from lantern.store.sqlite import SQLiteStore

        return SQLiteStore(url)
    if url.startswith(("postgresql:", "postgres:")):
        from lantern.store.postgres import PostgresStore

        return PostgresStore(url)
    from lantern.errors import UsageError

    raise UsageError(f"unsupported database URL {url!r}: use sqlite:///PATH or postgresql://...")
