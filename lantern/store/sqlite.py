"""The embedded backend: SQLite in WAL mode with ``synchronous=FULL``.

Every call runs as one whole transaction on a dedicated thread: writes on the writer thread
(SQLite has one writer anyway), reads on a reader thread with its own connection, which WAL
lets proceed beside a write. ``BEGIN IMMEDIATE`` takes the write lock up front, so several
processes sharing the file queue on it instead of failing mid-transaction.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from lantern.errors import Conflict, LeaseLost, NotFound, StoreError
from lantern.store.codec import dumps, loads_or_none
from lantern.store.group_commit import GroupCommitter
from lantern.store.migrations import migrations
from lantern.store.records import (
    ACTIVE,
    TERMINAL,
    AgentVersion,
    ApiKey,
    Append,
    Decision,
    Delivery,
    DeliveryStatus,
    Event,
    Lease,
    NewEvent,
    Orphan,
    Run,
    RunStatus,
    RunUpdate,
    RunUsage,
    SigningKey,
    StoredReceipt,
    WorkerInfo,
)

T = TypeVar("T")

_RUN_COLUMNS = (
    "id, workspace, agent_name, agent_version, status, input, output, error, created_at,"
    " updated_at, cancel_requested, parent_run_id, input_tokens, output_tokens, cost_usd,"
    " model_calls"
)
_EVENT_COLUMNS = "run_id, seq, kind, at, data, step_id, node_id, attempt, blob_digest, hash"


def _time(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def _run(row: sqlite3.Row) -> Run:
    return Run(
        id=row[0],
        workspace=row[1],
        agent_name=row[2],
        agent_version=row[3],
        status=row[4],
        input=loads_or_none(row[5]),
        output=loads_or_none(row[6]),
        error=loads_or_none(row[7]),
        created_at=_time(row[8]),
        updated_at=_time(row[9]),
        cancel_requested=bool(row[10]),
        parent_id=row[11],
        usage=RunUsage(row[12], row[13], row[14], row[15]),
    )


_RECEIPT_COLUMNS = (
    "run_id, step_id, delivery, attempt, idempotency_key, kind, target, status, response,"
    " claimed_at, completed_at"
)


def _delivery(row: sqlite3.Row) -> Delivery:
    run_id, step_id, name, attempt, key, kind, target, status = row[:8]
    return Delivery(
        run_id,
        step_id,
        name,
        attempt,
        key,
        kind,
        target,
        status,
        response=loads_or_none(row[8]),
        claimed_at=_time(row[9]),
        completed_at=None if row[10] is None else _time(row[10]),
    )


def _fence(conn: sqlite3.Connection, lease: Lease) -> None:
    row = conn.execute("SELECT epoch FROM run_locks WHERE run_id = ?", (lease.run_id,)).fetchone()
    if row is None or row[0] != lease.epoch:
        raise LeaseLost(lease.run_id, lease.epoch)


def _api_key(row: sqlite3.Row) -> ApiKey:
    return ApiKey(
        id=row[0],
        workspace=row[1],
        secret_hash=row[2],
        scopes=frozenset(row[3].split()),
        created_at=_time(row[4]),
        revoked_at=None if row[5] is None else _time(row[5]),
    )


def _event(row: sqlite3.Row, blob: bytes | None = None) -> Event:
    return Event(
        run_id=row[0],
        seq=row[1],
        kind=row[2],
        at=_time(row[3]),
        data=loads_or_none(row[4]),
        step_id=row[5],
        node_id=row[6],
        attempt=row[7],
        blob_digest=row[8],
        hash=row[9],
        blob=blob,
    )


def _path(url: str) -> str:
    # sqlite:///relative/path or sqlite:////absolute/path, as SQLAlchemy spells them.
    return url.removeprefix("sqlite:///")


class SQLiteStore:
    def __init__(self, url: str) -> None:
        self.url = url
        self.path = _path(url)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="lantern-sqlite-w")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="lantern-sqlite-r")
        self._wconn: sqlite3.Connection | None = None
        self._rconn: sqlite3.Connection | None = None
        self._commits = GroupCommitter[Append](self._append_batch)

    # -- plumbing ---------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def tx() -> T:
            conn = self._wconn
            assert conn is not None, "store is not open"
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

        return await asyncio.get_running_loop().run_in_executor(self._writer, tx)

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def tx() -> T:
            conn = self._rconn
            assert conn is not None, "store is not open"
            conn.execute("BEGIN")
            try:
                return fn(conn)
            finally:
                conn.execute("COMMIT")

        return await asyncio.get_running_loop().run_in_executor(self._reader, tx)

    async def open(self) -> None:
        if self._wconn is not None:
            return
        if self.path not in ("", ":memory:"):
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        self._wconn = await loop.run_in_executor(self._writer, self._connect)
        await self._write(self._migrate)
        self._rconn = await loop.run_in_executor(self._reader, self._connect)

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations"
            " (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
        for m in migrations("sqlite"):
            if m.version in done:
                continue
            # executescript would commit our transaction; run statement by statement instead.
            for statement in _statements(m.sql):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations VALUES (?, ?, ?)", (m.version, m.name, time.time())
            )

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        for conn, pool in ((self._wconn, self._writer), (self._rconn, self._reader)):
            if conn is not None:
                await loop.run_in_executor(pool, conn.close)
        self._wconn = self._rconn = None
        self._writer.shutdown(wait=False)
        self._reader.shutdown(wait=False)

    # -- agents -----------------------------------------------------------------------

    async def put_agent(
        self, workspace: str, name: str, definition: dict[str, Any]
    ) -> AgentVersion:
        now = time.time()

        def tx(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT COALESCE(MAX(version), 0) + 1 FROM agents WHERE workspace = ? AND name = ?",
                (workspace, name),
            ).fetchone()
            conn.execute(
                "INSERT INTO agents VALUES (?, ?, ?, ?, ?)",
                (workspace, name, row[0], dumps(definition), now),
            )
            return int(row[0])

        version = await self._write(tx)
        return AgentVersion(workspace, name, version, definition, _time(now))

    async def get_agent(
        self, workspace: str, name: str, version: int | None = None
    ) -> AgentVersion | None:
        sql = "SELECT workspace, name, version, definition, created_at FROM agents"
        sql += " WHERE workspace = ? AND name = ?"
        args: tuple[Any, ...] = (workspace, name)
        if version is not None:
            sql += " AND version = ?"
            args += (version,)
        sql += " ORDER BY version DESC LIMIT 1"
        row = await self._read(lambda c: c.execute(sql, args).fetchone())
        if row is None:
            return None
        return AgentVersion(row[0], row[1], row[2], loads_or_none(row[3]), _time(row[4]))

    async def list_agents(
        self, workspace: str, *, limit: int = 1000, after: str | None = None
    ) -> list[AgentVersion]:
        sql = (
            "SELECT a.workspace, a.name, a.version, a.definition, a.created_at FROM agents a"
            " WHERE a.workspace = ? AND a.name > ? AND a.version ="
            " (SELECT MAX(version) FROM agents b"
            " WHERE b.workspace = a.workspace AND b.name = a.name)"
            " ORDER BY a.name LIMIT ?"
        )
        args = (workspace, after or "", limit)
        rows = await self._read(lambda c: c.execute(sql, args).fetchall())
        return [AgentVersion(r[0], r[1], r[2], loads_or_none(r[3]), _time(r[4])) for r in rows]

    # -- runs -------------------------------------------------------------------------

    async def create_run(
        self, run: Run, *, idempotency_key: str | None = None, request_digest: str | None = None
    ) -> Run:
        sql = (
            "INSERT INTO runs (id, workspace, agent_name, agent_version, status, input,"
            " created_at, updated_at, idempotency_key, request_digest, parent_run_id)"
            " SELECT ?, workspace, name, version, ?, ?, ?, ?, ?, ?, ?"
            " FROM agents WHERE workspace = ? AND name = ? ORDER BY version DESC LIMIT 1"
            " RETURNING agent_version"
        )
        created = run.created_at.timestamp()
        args = (
            run.id,
            run.status,
            dumps(run.input),
            created,
            created,
            idempotency_key,
            request_digest,
            run.parent_id,
            run.workspace,
            run.agent_name,
        )
        try:
            row = await self._write(lambda c: c.execute(sql, args).fetchone())
        except sqlite3.IntegrityError as exc:
            if idempotency_key is not None and "idempotency_key" in str(exc):
                raise Conflict(f"idempotency key {idempotency_key!r} was already used") from exc
            raise StoreError(f"run {run.id}: {exc}") from exc
        if row is None:
            raise NotFound(f"agent {run.agent_name!r} not found (apply it first)")
        return replace(run, agent_version=row[0])

    async def run_for_key(self, workspace: str, idempotency_key: str) -> tuple[Run, str] | None:
        sql = (
            f"SELECT {_RUN_COLUMNS}, request_digest FROM runs"
            " WHERE workspace = ? AND idempotency_key = ?"
        )
        row = await self._read(lambda c: c.execute(sql, (workspace, idempotency_key)).fetchone())
        return None if row is None else (_run(row), row[16] or "")

    async def request_cancel(self, run_id: str) -> bool:
        sql = (
            "UPDATE runs SET cancel_requested = 1, updated_at = ?"
            " WHERE id = ? AND status NOT IN ('succeeded', 'failed', 'cancelled')"
        )
        args = (time.time(), run_id)
        return bool(await self._write(lambda c: c.execute(sql, args).rowcount))

    async def cancel_requested(self, run_ids: Sequence[str]) -> set[str]:
        if not run_ids:
            return set()
        sql = (
            f"SELECT id FROM runs WHERE cancel_requested = 1"
            f" AND id IN ({', '.join('?' * len(run_ids))})"
        )
        rows = await self._read(lambda c: c.execute(sql, tuple(run_ids)).fetchall())
        return {r[0] for r in rows}

    # -- API keys ---------------------------------------------------------------------

    async def create_api_key(self, key: ApiKey) -> None:
        args = (
            key.id,
            key.workspace,
            key.secret_hash,
            " ".join(sorted(key.scopes)),
            key.created_at.timestamp(),
        )
        await self._write(lambda c: c.execute("INSERT INTO api_keys VALUES (?,?,?,?,?,NULL)", args))

    async def get_api_key(self, key_id: str) -> ApiKey | None:
        sql = "SELECT * FROM api_keys WHERE id = ?"
        row = await self._read(lambda c: c.execute(sql, (key_id,)).fetchone())
        return None if row is None else _api_key(row)

    async def list_api_keys(self, workspace: str | None = None) -> list[ApiKey]:
        sql = "SELECT * FROM api_keys WHERE ? IS NULL OR workspace = ? ORDER BY created_at"
        rows = await self._read(lambda c: c.execute(sql, (workspace, workspace)).fetchall())
        return [_api_key(r) for r in rows]

    async def revoke_api_key(self, key_id: str) -> bool:
        sql = "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL"
        args = (time.time(), key_id)
        return bool(await self._write(lambda c: c.execute(sql, args).rowcount))

    async def workspace_usage(self, workspace: str, since: datetime) -> RunUsage:
        sql = (
            "SELECT COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0),"
            " COALESCE(SUM(cost_usd), 0), COALESCE(SUM(model_calls), 0)"
            " FROM runs WHERE workspace = ? AND created_at >= ?"
        )
        row = await self._read(lambda c: c.execute(sql, (workspace, since.timestamp())).fetchone())
        return RunUsage(int(row[0]), int(row[1]), float(row[2]), int(row[3]))

    async def get_run(self, run_id: str) -> Run | None:
        sql = f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?"
        row = await self._read(lambda c: c.execute(sql, (run_id,)).fetchone())
        return None if row is None else _run(row)

    async def list_runs(
        self,
        workspace: str,
        *,
        status: RunStatus | None = None,
        agent_name: str | None = None,
        limit: int = 50,
        before: str | None = None,
    ) -> list[Run]:
        sql = f"SELECT {_RUN_COLUMNS} FROM runs WHERE workspace = ?"
        args: list[Any] = [workspace]
        for condition, value in (
            ("status = ?", status),
            ("agent_name = ?", agent_name),
            ("id < ?", before),
        ):
            if value is not None:
                sql += " AND " + condition
                args.append(value)
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(limit)
        rows = await self._read(lambda c: c.execute(sql, args).fetchall())
        return [_run(r) for r in rows]

    # -- leases -----------------------------------------------------------------------

    # Wins a free or expired lease; ``reclaim`` also lets a worker id take back its own.
    _UPSERT_LEASE = (
        "INSERT INTO run_locks (run_id, worker_id, expires_at, epoch) VALUES (?, ?, ?, 1)"
        " ON CONFLICT (run_id) DO UPDATE SET worker_id = excluded.worker_id,"
        " expires_at = excluded.expires_at, epoch = run_locks.epoch + 1"
        " WHERE run_locks.expires_at <= ? OR (? AND run_locks.worker_id = excluded.worker_id)"
        " RETURNING epoch"
    )

    def _upsert_lease(
        self, conn: sqlite3.Connection, run_id: str, worker_id: str, ttl: float, reclaim: bool
    ) -> Lease | None:
        now = time.time()
        row = conn.execute(
            self._UPSERT_LEASE, (run_id, worker_id, now + ttl, now, reclaim)
        ).fetchone()
        return None if row is None else Lease(run_id, worker_id, int(row[0]))

    async def acquire_lease(
        self, run_id: str, worker_id: str, ttl: float, *, reclaim: bool = True
    ) -> Lease | None:
        return await self._write(lambda c: self._upsert_lease(c, run_id, worker_id, ttl, reclaim))

    async def claim_runs(
        self, worker_id: str, ttl: float, limit: int, statuses: tuple[RunStatus, ...]
    ) -> list[Lease]:
        orphans = await self._steal(worker_id, ttl, limit, statuses)
        return [o.lease for o in orphans if o.lease is not None]

    async def recover_orphans(self, worker_id: str, ttl: float, limit: int) -> list[Orphan]:
        return await self._steal(worker_id, ttl, limit, ACTIVE)

    async def _steal(
        self, worker_id: str, ttl: float, limit: int, statuses: tuple[RunStatus, ...]
    ) -> list[Orphan]:
        # Expired leases (oldest expiry first), then queued runs never leased: as postgres.py.
        marks = ",".join("?" * len(statuses))
        expired = (
            "SELECT r.id, l.worker_id, l.expires_at FROM run_locks l"
            " JOIN runs r ON r.id = l.run_id"
            f" WHERE l.expires_at > 0 AND l.expires_at <= ? AND r.status IN ({marks})"
            " ORDER BY l.expires_at LIMIT ?"
        )
        unleased = (
            "SELECT r.id, NULL, NULL FROM runs r WHERE r.status = 'queued'"
            " AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id)"
            " ORDER BY r.created_at LIMIT ?"
        )
        # Parked runs that are due: woken by a decision, a finished child or a timeout.
        woken = (
            "SELECT r.id, NULL, NULL FROM runs r WHERE r.status = 'waiting' AND r.wake_at <= ?"
            " AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id"
            " AND l.expires_at > ?) ORDER BY r.wake_at LIMIT ?"
        )

        def tx(conn: sqlite3.Connection) -> list[Orphan]:
            now = time.time()
            found = conn.execute(expired, (now, *statuses, limit)).fetchall()
            if "queued" in statuses and len(found) < limit:
                found += conn.execute(unleased, (limit - len(found),)).fetchall()
            if "queued" in statuses and len(found) < limit:
                found += conn.execute(woken, (now, now, limit - len(found))).fetchall()
            return [
                Orphan(
                    run_id,
                    self._upsert_lease(conn, run_id, worker_id, ttl, False),
                    previous,
                    None if expired is None else _time(expired),
                )
                for run_id, previous, expired in found
            ]

        return await self._write(tx)

    # -- workers ----------------------------------------------------------------------

    async def heartbeat(self, worker_id: str, started_at: datetime) -> None:
        sql = (
            "INSERT INTO workers (id, started_at, heartbeat_at) VALUES (?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET started_at = excluded.started_at,"
            " heartbeat_at = excluded.heartbeat_at, stopped_at = NULL"
        )
        args = (worker_id, started_at.timestamp(), time.time())
        await self._write(lambda c: c.execute(sql, args))

    async def worker_stopped(self, worker_id: str) -> None:
        args = (time.time(), worker_id)
        await self._write(
            lambda c: c.execute("UPDATE workers SET stopped_at = ? WHERE id = ?", args)
        )

    async def list_workers(self) -> list[WorkerInfo]:
        def tx(conn: sqlite3.Connection) -> list[WorkerInfo]:
            now = time.time()
            workers = conn.execute("SELECT * FROM workers ORDER BY id").fetchall()
            return [
                WorkerInfo(
                    w[0],
                    _time(w[1]),
                    _time(w[2]),
                    None if w[3] is None else _time(w[3]),
                    tuple(
                        r[0]
                        for r in conn.execute(
                            "SELECT run_id FROM run_locks WHERE worker_id = ? AND expires_at > ?"
                            " ORDER BY run_id",
                            (w[0], now),
                        )
                    ),
                )
                for w in workers
            ]

        return await self._read(tx)

    async def runs_leased_by(self, worker_id: str) -> list[str]:
        sql = (
            "SELECT l.run_id FROM run_locks l JOIN runs r ON r.id = l.run_id"
            " WHERE l.worker_id = ? AND r.status IN ('queued', 'running') ORDER BY r.created_at"
        )
        rows = await self._read(lambda c: c.execute(sql, (worker_id,)).fetchall())
        return [r[0] for r in rows]

    async def renew_lease(self, lease: Lease, ttl: float) -> bool:
        # A lease given up by the commit that finished or parked its run stays given up.
        sql = (
            "UPDATE run_locks SET expires_at = ? WHERE run_id = ? AND epoch = ? AND expires_at > 0"
        )
        args = (time.time() + ttl, lease.run_id, lease.epoch)
        return bool(await self._write(lambda c: c.execute(sql, args).rowcount))

    async def release_lease(self, lease: Lease) -> None:
        # An unfinished run's lease expires now, so the sweep hands the run on; a finished
        # run's leaves the index of unreleased leases.
        sql = (
            "UPDATE run_locks SET expires_at = CASE WHEN (SELECT status FROM runs WHERE id = ?)"
            " IN ('queued', 'running') THEN ? ELSE 0 END WHERE run_id = ? AND epoch = ?"
        )
        args = (lease.run_id, time.time(), lease.run_id, lease.epoch)
        await self._write(lambda c: c.execute(sql, args))

    # -- journal ----------------------------------------------------------------------

    async def start_run(
        self,
        run_id: str,
        worker_id: str,
        ttl: float,
        events: Sequence[NewEvent],
        update: RunUpdate,
    ) -> Lease | None:
        def tx(conn: sqlite3.Connection) -> Lease | None:
            status = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
            journal = conn.execute(
                "SELECT 1 FROM journal_events WHERE run_id = ? LIMIT 1", (run_id,)
            ).fetchone()
            if status is None or status[0] != "queued" or journal is not None:
                return None
            lease = self._upsert_lease(conn, run_id, worker_id, ttl, True)
            if lease is not None:
                _append_one(conn, Append(lease, tuple(events), update))
            return lease

        return await self._write(tx)

    async def claim_delivery(self, lease: Lease, delivery: Delivery) -> Delivery:
        d = delivery

        def tx(conn: sqlite3.Connection) -> Delivery:
            _fence(conn, lease)
            conn.execute(
                "INSERT INTO side_effect_receipts (run_id, step_id, delivery, attempt,"
                " idempotency_key, kind, target, status, claimed_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 'claimed', ?)"
                " ON CONFLICT (run_id, step_id, delivery) DO UPDATE SET"
                " attempt = excluded.attempt, idempotency_key = excluded.idempotency_key,"
                " status = 'claimed', response = NULL, claimed_at = excluded.claimed_at,"
                " completed_at = NULL WHERE side_effect_receipts.status = 'failed'",
                (
                    d.run_id,
                    d.step_id,
                    d.name,
                    d.attempt,
                    d.idempotency_key,
                    d.kind,
                    d.target,
                    time.time(),
                ),
            )
            row = conn.execute(
                f"SELECT {_RECEIPT_COLUMNS} FROM side_effect_receipts"
                " WHERE run_id = ? AND step_id = ? AND delivery = ?",
                (d.run_id, d.step_id, d.name),
            ).fetchone()
            return _delivery(row)

        return await self._write(tx)

    async def finish_delivery(
        self, lease: Lease, delivery: Delivery, status: DeliveryStatus, response: Any
    ) -> None:
        def tx(conn: sqlite3.Connection) -> None:
            _fence(conn, lease)
            conn.execute(
                "UPDATE side_effect_receipts SET status = ?, response = ?, completed_at = ?"
                " WHERE run_id = ? AND step_id = ? AND delivery = ?",
                (
                    status,
                    None if response is None else dumps(response),
                    time.time(),
                    delivery.run_id,
                    delivery.step_id,
                    delivery.name,
                ),
            )

        await self._write(tx)

    async def deliveries(self, run_id: str) -> list[Delivery]:
        sql = (
            f"SELECT {_RECEIPT_COLUMNS} FROM side_effect_receipts WHERE run_id = ?"
            " ORDER BY claimed_at, step_id, delivery"
        )
        rows = await self._read(lambda c: c.execute(sql, (run_id,)).fetchall())
        return [_delivery(r) for r in rows]

    async def append(self, batch: Append) -> None:
        await self._commits.submit(batch)

    async def _append_batch(self, batch: Sequence[Append]) -> list[BaseException | None]:
        if len(batch) == 1:  # alone in its transaction: no savepoint needed
            try:
                return [await self._write(lambda c: _append_one(c, batch[0]))]
            except sqlite3.IntegrityError as exc:
                return [_refused(batch[0], exc)]
        return await self._write(lambda c: [_isolated(c, item) for item in batch])

    async def events(self, run_id: str, *, after: int = 0, blobs: bool = False) -> list[Event]:
        if blobs:
            sql = (
                f"SELECT {', '.join('e.' + c for c in _EVENT_COLUMNS.split(', '))}, b.body"
                " FROM journal_events e LEFT JOIN blobs b ON b.digest = e.blob_digest"
                " WHERE e.run_id = ? AND e.seq > ? ORDER BY e.seq"
            )
        else:
            sql = (
                f"SELECT {_EVENT_COLUMNS}, NULL FROM journal_events"
                " WHERE run_id = ? AND seq > ? ORDER BY seq"
            )
        rows = await self._read(lambda c: c.execute(sql, (run_id, after)).fetchall())
        return [_event(r, r[10]) for r in rows]

    # -- run control: parked runs, approvals, sub-agents ------------------------------

    async def decide(self, decision: Decision) -> bool:
        d = decision

        def tx(conn: sqlite3.Connection) -> bool:
            now = time.time()
            done = conn.execute(
                "INSERT INTO approvals (run_id, node_id, decision, decided_by, comment,"
                " decided_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (d.run_id, d.node_id, d.decision, d.decided_by, d.comment, now),
            ).rowcount
            if done:
                conn.execute(
                    "UPDATE runs SET wake_at = ? WHERE id = ? AND status = 'waiting'",
                    (now, d.run_id),
                )
            return bool(done)

        return await self._write(tx)

    async def decisions(self, run_id: str) -> dict[str, Decision]:
        rows = await self._read(
            lambda c: c.execute(
                "SELECT run_id, node_id, decision, decided_by, comment, decided_at"
                " FROM approvals WHERE run_id = ?",
                (run_id,),
            ).fetchall()
        )
        return {r[1]: Decision(r[0], r[1], r[2], r[3], r[4], _time(r[5])) for r in rows}

    async def wake(self, run_id: str) -> None:
        sql = "UPDATE runs SET wake_at = ? WHERE id = ? AND status = 'waiting'"
        args = (time.time(), run_id)
        await self._write(lambda c: c.execute(sql, args))

    async def children(self, run_id: str) -> list[Run]:
        sql = f"SELECT {_RUN_COLUMNS} FROM runs WHERE parent_run_id = ? ORDER BY id"
        rows = await self._read(lambda c: c.execute(sql, (run_id,)).fetchall())
        return [_run(r) for r in rows]

    async def recent_step_usage(
        self, workspace: str, agent_name: str, runs: int = 50
    ) -> list[tuple[str, dict[str, Any]]]:
        sql = (
            "SELECT e.step_id, json_extract(e.data, '$.output.usage') FROM journal_events e"
            " WHERE e.run_id IN (SELECT id FROM runs WHERE workspace = ? AND agent_name = ?"
            "  AND status = 'succeeded' ORDER BY id DESC LIMIT ?)"
            " AND e.kind = 'step_completed'"
            " AND json_type(e.data, '$.output.usage') = 'object'"
        )
        rows = await self._read(lambda c: c.execute(sql, (workspace, agent_name, runs)).fetchall())
        return [(r[0], loads_or_none(r[1])) for r in rows]

    # -- webhook signing secrets ------------------------------------------------------

    async def signing_secrets(self, workspace: str) -> list[str]:
        sql = (
            "SELECT secret, CASE WHEN previous_until > ? THEN previous_secret END"
            " FROM signing_secrets WHERE workspace = ?"
        )
        args = (time.time(), workspace)
        row = await self._read(lambda c: c.execute(sql, args).fetchone())
        return [] if row is None else [s for s in row if s is not None]

    async def ensure_signing_secret(self, workspace: str, secret: str) -> str:
        def tx(conn: sqlite3.Connection) -> str:
            conn.execute(
                "INSERT INTO signing_secrets (workspace, secret, created_at) VALUES (?, ?, ?)"
                " ON CONFLICT (workspace) DO NOTHING",
                (workspace, secret, time.time()),
            )
            sql = "SELECT secret FROM signing_secrets WHERE workspace = ?"
            return str(conn.execute(sql, (workspace,)).fetchone()[0])

        return await self._write(tx)

    async def rotate_signing_secret(self, workspace: str, secret: str, overlap_s: float) -> None:
        now = time.time()
        keep = overlap_s > 0
        sql = (
            "INSERT INTO signing_secrets (workspace, secret, created_at) VALUES (?, ?, ?)"
            " ON CONFLICT (workspace) DO UPDATE SET secret = excluded.secret,"
            " created_at = excluded.created_at,"
            " previous_secret = CASE WHEN ? THEN signing_secrets.secret END,"
            " previous_until = ?"
        )
        args = (workspace, secret, now, keep, now + overlap_s if keep else None)
        await self._write(lambda c: c.execute(sql, args))

    # -- receipts ---------------------------------------------------------------------

    async def journal_head(self, run_id: str) -> tuple[int, str | None]:
        sql = (
            "SELECT COUNT(*), (SELECT hash FROM journal_events WHERE run_id = ?"
            " ORDER BY seq DESC LIMIT 1) FROM journal_events WHERE run_id = ?"
        )
        row = await self._read(lambda c: c.execute(sql, (run_id, run_id)).fetchone())
        return int(row[0]), row[1]

    async def register_signing_key(self, kid: str, x: str) -> None:
        sql = "INSERT INTO signing_keys VALUES (?, ?, ?) ON CONFLICT (kid) DO NOTHING"
        args = (kid, x, time.time())
        await self._write(lambda c: c.execute(sql, args))

    async def signing_keys(self) -> list[SigningKey]:
        sql = "SELECT kid, x, created_at FROM signing_keys ORDER BY created_at, kid"
        rows = await self._read(lambda c: c.execute(sql).fetchall())
        return [SigningKey(r[0], r[1], _time(r[2])) for r in rows]

    async def put_receipt(self, receipt: StoredReceipt) -> StoredReceipt:
        r = receipt

        def tx(conn: sqlite3.Connection) -> StoredReceipt:
            conn.execute(
                "INSERT INTO receipts VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
                (r.run_id, r.key_id, r.body, r.signature, time.time()),
            )
            stored = _receipt(conn, r.run_id)
            assert stored is not None
            return stored

        return await self._write(tx)

    async def get_receipt(self, run_id: str) -> StoredReceipt | None:
        return await self._read(lambda c: _receipt(c, run_id))


def _isolated(conn: sqlite3.Connection, item: Append) -> BaseException | None:
    """One run's append inside a shared transaction: a savepoint keeps a refusal its own."""
    conn.execute("SAVEPOINT one_append")
    outcome: BaseException | None
    try:
        outcome = _append_one(conn, item)
    except sqlite3.IntegrityError as exc:
        conn.execute("ROLLBACK TO one_append")
        outcome = _refused(item, exc)
    conn.execute("RELEASE one_append")
    return outcome


def _refused(item: Append, exc: Exception) -> StoreError:
    return StoreError(f"run {item.lease.run_id}: journal write refused: {exc}")


def _append_one(conn: sqlite3.Connection, item: Append) -> LeaseLost | None:
    """Fenced by the lease epoch (SQLite's one writer serialises this with any steal)."""
    lease = item.lease
    row = conn.execute("SELECT epoch FROM run_locks WHERE run_id = ?", (lease.run_id,)).fetchone()
    if row is None or row[0] != lease.epoch:
        return LeaseLost(lease.run_id, lease.epoch)
    blobs = [(e.blob.digest, e.blob.body) for e in item.events if e.blob is not None]
    if blobs:
        conn.executemany("INSERT OR IGNORE INTO blobs (digest, body) VALUES (?, ?)", blobs)
    conn.executemany(
        f"INSERT INTO journal_events ({_EVENT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
        [
            (
                lease.run_id,
                e.seq,
                e.kind,
                e.at.timestamp(),
                dumps(e.data),
                e.step_id,
                e.node_id,
                e.attempt,
                None if e.blob is None else e.blob.digest,
                e.hash,
            )
            for e in item.events
        ],
    )
    if item.update is not None:
        u = item.update
        conn.execute(
            "UPDATE runs SET status = ?, output = ?, error = ?, updated_at = ?, wake_at = ?"
            " WHERE id = ?",
            (
                u.status,
                None if u.output is None else dumps(u.output),
                None if u.error is None else dumps(u.error),
                time.time(),
                None if u.wake_at is None else u.wake_at.timestamp(),
                lease.run_id,
            ),
        )
        if u.releases:
            conn.execute(
                "UPDATE run_locks SET expires_at = 0 WHERE run_id = ? AND epoch = ?",
                (lease.run_id, lease.epoch),
            )
        if u.status in TERMINAL:
            # A parent parked on this run (a sub-agent) is due now.
            conn.execute(
                "UPDATE runs SET wake_at = ? WHERE status = 'waiting'"
                " AND id = (SELECT parent_run_id FROM runs WHERE id = ?)",
                (time.time(), lease.run_id),
            )
    return None


def _receipt(conn: sqlite3.Connection, run_id: str) -> StoredReceipt | None:
    sql = "SELECT run_id, key_id, body, signature, created_at FROM receipts WHERE run_id = ?"
    row = conn.execute(sql, (run_id,)).fetchone()
    if row is None:
        return None
    return StoredReceipt(row[0], row[1], row[2], row[3], _time(row[4]))


def _statements(script: str) -> list[str]:
    """Split a migration into statements (our SQL files hold no semicolons in literals); a
    trigger's body holds several, so pieces join until SQLite calls the statement complete."""
    lines = [line for line in script.splitlines() if not line.lstrip().startswith("--")]
    statements, pending = [], ""
    for piece in "\n".join(lines).split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                statements.append(pending.strip())
            pending = ""
    return statements
