"""The shared backend: PostgreSQL through psycopg 3 and its async connection pool.

Leases use the database's clock (``now()``), so replicas with skewed clocks agree on expiry.
A journal append is one statement: it takes a share lock on the writer's lease row at the
writer's epoch, inserts the events only if that row exists, and updates the run, so a steal
(which updates the lease row) and a fenced write are strictly ordered.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from lantern.errors import Conflict, LeaseLost, NotFound, StoreError
from lantern.store.codec import dumps
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

log = logging.getLogger("lantern.store.postgres")

_RUN_COLUMNS = (
    "id, workspace, agent_name, agent_version, status, input, output, error, created_at,"
    " updated_at, cancel_requested, parent_run_id, input_tokens, output_tokens, cost_usd,"
    " model_calls"
)
_KEY_COLUMNS = "id, workspace, secret_hash, scopes, created_at, revoked_at"
_EVENT_COLUMNS = "run_id, seq, kind, at, data, step_id, node_id, attempt, blob_digest, hash"
_MIGRATION_LOCK = 0x4C414E54  # "LANT": one replica migrates at a time

# One statement per group commit. The batch travels as one JSON document: psycopg adapts a
# single string far faster than a dozen typed arrays.
_APPEND = """
WITH batch AS (
    SELECT * FROM json_to_recordset(%(events)s::json) AS b(
        run_id text, epoch bigint, seq bigint, kind text, at timestamptz, data jsonb,
        step_id text, node_id text, attempt int, blob_digest text, hash text)
), updates AS (
    SELECT * FROM json_to_recordset(%(updates)s::json) AS u(
        run_id text, epoch bigint, status text, output jsonb, error jsonb, release boolean,
        wake_at timestamptz)
), fenced AS (
    SELECT l.run_id FROM run_locks l
    JOIN (SELECT run_id, epoch FROM batch UNION SELECT run_id, epoch FROM updates) w
      ON w.run_id = l.run_id AND w.epoch = l.epoch
    FOR SHARE OF l
), stored_blobs AS (
    INSERT INTO blobs (digest, body)
    SELECT digest, decode(body, 'base64')
    FROM json_to_recordset(%(blobs)s::json) AS x(digest text, body text)
    ON CONFLICT DO NOTHING
), inserted AS (
    INSERT INTO journal_events
        (run_id, seq, kind, at, data, step_id, node_id, attempt, blob_digest, hash)
    SELECT run_id, seq, kind, at, data, step_id, node_id, attempt, blob_digest, hash
    FROM batch WHERE run_id IN (SELECT run_id FROM fenced)
), updated AS (
    UPDATE runs r SET status = u.status, output = u.output, error = u.error, updated_at = now(),
                      wake_at = u.wake_at
    FROM updates u WHERE r.id = u.run_id AND u.run_id IN (SELECT run_id FROM fenced)
), woken AS (
    -- A parent parked on a finished sub-agent is due now.
    UPDATE runs p SET wake_at = now()
    FROM updates u JOIN runs c ON c.id = u.run_id
    WHERE u.status IN ('succeeded', 'failed', 'cancelled') AND p.id = c.parent_run_id
      AND p.status = 'waiting' AND u.run_id IN (SELECT run_id FROM fenced)
), released AS (
    UPDATE run_locks l SET expires_at = 'epoch'
    FROM updates u
    WHERE u.release AND l.run_id = u.run_id AND l.run_id IN (SELECT run_id FROM fenced)
)
SELECT run_id FROM fenced
"""

# Find runs with no live lease and steal their leases: leases that expired (through the
# partial index of unreleased leases, oldest expiry first) and queued runs never leased
# (through the partial index of queued runs). Neither scan reads running or finished runs, so
# a pass costs the same however many there are. SKIP LOCKED lets replicas sweep side by side
# without waiting on each other; the UPSERT still wins only an expired lease.
_STEAL = """
WITH expired AS (
    SELECT r.id, l.worker_id AS previous_worker, l.expires_at AS expired_at
    FROM run_locks l JOIN runs r ON r.id = l.run_id
    WHERE l.expires_at > 'epoch' AND l.expires_at <= now() AND r.status IN ({statuses})
    ORDER BY l.expires_at LIMIT %(limit)s
    FOR NO KEY UPDATE OF r SKIP LOCKED
), unleased AS (
    SELECT r.id, NULL::text AS previous_worker, NULL::timestamptz AS expired_at
    FROM runs r
    WHERE r.status = 'queued' AND %(queued)s
      AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id)
    ORDER BY r.created_at LIMIT %(limit)s
    FOR NO KEY UPDATE OF r SKIP LOCKED
), woken AS (
    -- Parked runs that are due: woken by a decision, a finished child or a timeout.
    SELECT r.id, NULL::text AS previous_worker, NULL::timestamptz AS expired_at
    FROM runs r
    WHERE r.status = 'waiting' AND r.wake_at <= now() AND %(queued)s
      AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id AND l.expires_at > now())
    ORDER BY r.wake_at LIMIT %(limit)s
    FOR NO KEY UPDATE OF r SKIP LOCKED
), found AS (
    SELECT * FROM expired UNION ALL SELECT * FROM unleased UNION ALL SELECT * FROM woken
    LIMIT %(limit)s
), stolen AS (
    INSERT INTO run_locks (run_id, worker_id, expires_at, epoch)
    SELECT id, %(worker)s, now() + make_interval(secs => %(ttl)s), 1 FROM found
    ON CONFLICT (run_id) DO UPDATE SET worker_id = excluded.worker_id,
        expires_at = excluded.expires_at, epoch = run_locks.epoch + 1
    WHERE run_locks.expires_at <= now()
    RETURNING run_id, epoch
)
SELECT f.id, s.epoch, f.previous_worker, f.expired_at
FROM found f LEFT JOIN stolen s ON s.run_id = f.id
"""

_RECEIPT_COLUMNS = (
    "run_id, step_id, delivery, attempt, idempotency_key, kind, target, status, response,"
    " claimed_at, completed_at"
)

# Claim a delivery under the lease (a share lock on the lease row orders it with any steal):
# a new receipt, or a failed one taken over for this attempt; otherwise the stored receipt.
# No row at all: the lease is gone.
_CLAIM = f"""
WITH fenced AS (
    SELECT run_id FROM run_locks WHERE run_id = %(run)s AND epoch = %(epoch)s FOR SHARE
), claimed AS (
    INSERT INTO side_effect_receipts
        (run_id, step_id, delivery, attempt, idempotency_key, kind, target, status)
    SELECT run_id, %(step)s, %(name)s, %(attempt)s, %(key)s, %(kind)s, %(target)s, 'claimed'
    FROM fenced
    ON CONFLICT (run_id, step_id, delivery) DO UPDATE SET attempt = excluded.attempt,
        idempotency_key = excluded.idempotency_key, status = 'claimed', response = NULL,
        claimed_at = now(), completed_at = NULL
    WHERE side_effect_receipts.status = 'failed'
    RETURNING {_RECEIPT_COLUMNS}
)
SELECT {_RECEIPT_COLUMNS} FROM claimed
UNION ALL
SELECT {_RECEIPT_COLUMNS} FROM side_effect_receipts
WHERE run_id = %(run)s AND step_id = %(step)s AND delivery = %(name)s
  AND EXISTS (SELECT 1 FROM fenced) AND NOT EXISTS (SELECT 1 FROM claimed)
"""

_FINISH = """
WITH fenced AS (
    SELECT run_id FROM run_locks WHERE run_id = %(run)s AND epoch = %(epoch)s FOR SHARE
)
UPDATE side_effect_receipts SET status = %(status)s, response = %(response)s::jsonb,
    completed_at = now()
WHERE run_id IN (SELECT run_id FROM fenced) AND step_id = %(step)s AND delivery = %(name)s
RETURNING 1
"""

# Pins the agent's newest version in the same statement (one round trip per create).
_CREATE_RUN = """
INSERT INTO runs (id, workspace, agent_name, agent_version, status, input, created_at,
                  updated_at, idempotency_key, request_digest, parent_run_id)
SELECT %(id)s, workspace, name, version, %(status)s, %(input)s, %(created)s, %(created)s,
       %(key)s, %(digest)s, %(parent)s
FROM agents WHERE workspace = %(workspace)s AND name = %(agent)s
ORDER BY version DESC LIMIT 1
RETURNING agent_version
"""

# Lease a never-started run and write its opening events in one statement: the events and
# the run update land only if the lease row was won.
_START_RUN = """
WITH lease AS (
    INSERT INTO run_locks (run_id, worker_id, expires_at, epoch)
    SELECT id, %(worker)s,
           CASE WHEN %(release)s THEN 'epoch' ELSE now() + make_interval(secs => %(ttl)s) END, 1
    FROM runs
    WHERE id = %(run)s AND status = 'queued'
      AND NOT EXISTS (SELECT 1 FROM journal_events WHERE run_id = %(run)s)
    ON CONFLICT (run_id) DO UPDATE SET worker_id = excluded.worker_id,
        expires_at = excluded.expires_at, epoch = run_locks.epoch + 1
    WHERE run_locks.expires_at <= now() OR run_locks.worker_id = excluded.worker_id
    RETURNING run_id, epoch
), stored_blobs AS (
    INSERT INTO blobs (digest, body)
    SELECT digest, decode(body, 'base64')
    FROM json_to_recordset(%(blobs)s::json) AS x(digest text, body text)
    ON CONFLICT DO NOTHING
), inserted AS (
    INSERT INTO journal_events
        (run_id, seq, kind, at, data, step_id, node_id, attempt, blob_digest, hash)
    SELECT l.run_id, b.seq, b.kind, b.at, b.data, b.step_id, b.node_id, b.attempt, b.blob_digest,
           b.hash
    FROM lease l, json_to_recordset(%(events)s::json) AS b(
        seq bigint, kind text, at timestamptz, data jsonb, step_id text, node_id text,
        attempt int, blob_digest text, hash text)
), updated AS (
    UPDATE runs SET status = %(status)s, output = %(output)s::jsonb, error = %(error)s::jsonb,
                    updated_at = now()
    WHERE id IN (SELECT run_id FROM lease)
)
SELECT epoch FROM lease
"""


def _run(row: TupleRow) -> Run:
    run = Run(*row[:12])
    return replace(run, usage=RunUsage(row[12], row[13], float(row[14]), row[15]))


def _api_key(row: TupleRow) -> ApiKey:
    return ApiKey(row[0], row[1], row[2], frozenset(row[3].split()), row[4], row[5])


def _event(row: TupleRow, blob: bytes | None = None) -> Event:
    run_id, seq, kind, at, data, step_id, node_id, attempt, blob_digest, hash_ = row[:10]
    return Event(run_id, seq, kind, at, data, step_id, node_id, attempt, blob_digest, blob, hash_)


def _literal_statuses(statuses: tuple[RunStatus, ...]) -> str:
    assert all(s in ACTIVE for s in statuses), statuses  # literals, never caller text
    return ", ".join(f"'{s}'" for s in statuses)


def _event_rows(
    events: Iterable[NewEvent], run_id: str | None = None, epoch: int | None = None
) -> list[dict[str, Any]]:
    return [
        {
            "run_id": run_id,
            "epoch": epoch,
            "seq": e.seq,
            "kind": e.kind,
            "at": e.at.isoformat(),
            "data": e.data,
            "step_id": e.step_id,
            "node_id": e.node_id,
            "attempt": e.attempt,
            "blob_digest": None if e.blob is None else e.blob.digest,
            "hash": e.hash,
        }
        for e in events
    ]


def _blob_rows(events: Iterable[NewEvent]) -> str:
    return dumps(
        [
            {"digest": e.blob.digest, "body": base64.b64encode(e.blob.body).decode()}
            for e in events
            if e.blob is not None
        ]
    )


def _refused(item: Append, exc: Exception) -> StoreError:
    return StoreError(f"run {item.lease.run_id}: journal write refused: {exc}")


def _json_or_none(value: Any) -> str | None:
    return None if value is None else dumps(value)


class PostgresStore:
    def __init__(self, url: str, *, max_connections: int = 10) -> None:
        self.url = url
        self._pool = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=max_connections,
            open=False,
            kwargs={"autocommit": True},
            name="lantern",
        )
        self._commits = GroupCommitter[Append](self._append_batch)
        self._writer: psycopg.AsyncConnection[TupleRow] | None = None

    async def open(self) -> None:
        await self._pool.open(wait=True, timeout=30)
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY,"
                " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            cur = await conn.execute("SELECT version FROM schema_migrations")
            done = {r[0] for r in await cur.fetchall()}
            for m in migrations("postgres"):
                if m.version not in done:
                    await conn.execute(m.sql.encode())
                    await conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                        (m.version, m.name),
                    )

    async def close(self) -> None:
        if self._writer is not None:
            await self._writer.close()
        await self._pool.close()

    async def _fetchall(
        self, sql: str, args: Sequence[Any] | dict[str, Any] = ()
    ) -> list[TupleRow]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql.encode(), args)
            return await cur.fetchall()

    async def _fetchone(
        self, sql: str, args: Sequence[Any] | dict[str, Any] = ()
    ) -> TupleRow | None:
        rows = await self._fetchall(sql, args)
        return rows[0] if rows else None

    # -- agents -----------------------------------------------------------------------

    async def put_agent(
        self, workspace: str, name: str, definition: dict[str, Any]
    ) -> AgentVersion:
        async with self._pool.connection() as conn, conn.transaction():
            # Serialise versions of one agent; a unique violation would also catch a race.
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"agent:{workspace}/{name}",)
            )
            cur = await conn.execute(
                "INSERT INTO agents (workspace, name, version, definition)"
                " SELECT %s, %s, COALESCE(MAX(version), 0) + 1, %s FROM agents"
                " WHERE workspace = %s AND name = %s RETURNING version, created_at",
                (workspace, name, Jsonb(definition), workspace, name),
            )
            row = await cur.fetchone()
        assert row is not None
        return AgentVersion(workspace, name, row[0], definition, row[1])

    async def get_agent(
        self, workspace: str, name: str, version: int | None = None
    ) -> AgentVersion | None:
        sql = (
            "SELECT workspace, name, version, definition, created_at FROM agents"
            " WHERE workspace = %s AND name = %s"
        )
        args: tuple[Any, ...] = (workspace, name)
        if version is not None:
            sql += " AND version = %s"
            args += (version,)
        row = await self._fetchone(sql + " ORDER BY version DESC LIMIT 1", args)
        return None if row is None else AgentVersion(*row)

    async def list_agents(
        self, workspace: str, *, limit: int = 1000, after: str | None = None
    ) -> list[AgentVersion]:
        rows = await self._fetchall(
            "SELECT DISTINCT ON (name) workspace, name, version, definition, created_at"
            " FROM agents WHERE workspace = %s AND name > %s ORDER BY name, version DESC"
            " LIMIT %s",
            (workspace, after or "", limit),
        )
        return [AgentVersion(*r) for r in rows]

    # -- runs -------------------------------------------------------------------------

    async def create_run(
        self, run: Run, *, idempotency_key: str | None = None, request_digest: str | None = None
    ) -> Run:
        args = {
            "id": run.id,
            "workspace": run.workspace,
            "agent": run.agent_name,
            "status": run.status,
            "input": Jsonb(run.input),
            "created": run.created_at,
            "key": idempotency_key,
            "digest": request_digest,
            "parent": run.parent_id,
        }
        try:
            row = await self._fetchone(_CREATE_RUN, args)
        except psycopg.errors.UniqueViolation as exc:
            if idempotency_key is not None and "idempotency" in str(exc):
                raise Conflict(f"idempotency key {idempotency_key!r} was already used") from exc
            raise StoreError(f"run {run.id}: {exc}") from exc
        if row is None:
            raise NotFound(f"agent {run.agent_name!r} not found (apply it first)")
        return replace(run, agent_version=row[0])

    async def run_for_key(self, workspace: str, idempotency_key: str) -> tuple[Run, str] | None:
        row = await self._fetchone(
            f"SELECT {_RUN_COLUMNS}, request_digest FROM runs"
            " WHERE workspace = %s AND idempotency_key = %s",
            (workspace, idempotency_key),
        )
        return None if row is None else (_run(row), row[16] or "")

    async def request_cancel(self, run_id: str) -> bool:
        row = await self._fetchone(
            "UPDATE runs SET cancel_requested = true, updated_at = now()"
            " WHERE id = %s AND status NOT IN ('succeeded', 'failed', 'cancelled') RETURNING 1",
            (run_id,),
        )
        return row is not None

    async def cancel_requested(self, run_ids: Sequence[str]) -> set[str]:
        if not run_ids:
            return set()
        rows = await self._fetchall(
            "SELECT id FROM runs WHERE id = ANY(%s) AND cancel_requested", (list(run_ids),)
        )
        return {r[0] for r in rows}

    # -- API keys ---------------------------------------------------------------------

    async def create_api_key(self, key: ApiKey) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(
                "INSERT INTO api_keys (id, workspace, secret_hash, scopes, created_at)"
                " VALUES (%s, %s, %s, %s, %s)",
                (
                    key.id,
                    key.workspace,
                    key.secret_hash,
                    " ".join(sorted(key.scopes)),
                    key.created_at,
                ),
            )

    async def get_api_key(self, key_id: str) -> ApiKey | None:
        row = await self._fetchone(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = %s", (key_id,))
        return None if row is None else _api_key(row)

    async def list_api_keys(self, workspace: str | None = None) -> list[ApiKey]:
        rows = await self._fetchall(
            f"SELECT {_KEY_COLUMNS} FROM api_keys"
            " WHERE %s::text IS NULL OR workspace = %s ORDER BY created_at",
            (workspace, workspace),
        )
        return [_api_key(r) for r in rows]

    async def revoke_api_key(self, key_id: str) -> bool:
        row = await self._fetchone(
            "UPDATE api_keys SET revoked_at = now() WHERE id = %s AND revoked_at IS NULL"
            " RETURNING 1",
            (key_id,),
        )
        return row is not None

    async def workspace_usage(self, workspace: str, since: datetime) -> RunUsage:
        row = await self._fetchone(
            "SELECT COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0),"
            " COALESCE(SUM(cost_usd), 0), COALESCE(SUM(model_calls), 0)"
            " FROM runs WHERE workspace = %s AND created_at >= %s",
            (workspace, since),
        )
        assert row is not None
        return RunUsage(int(row[0]), int(row[1]), float(row[2]), int(row[3]))

    async def get_run(self, run_id: str) -> Run | None:
        row = await self._fetchone(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = %s", (run_id,))
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
        sql = f"SELECT {_RUN_COLUMNS} FROM runs WHERE workspace = %s"
        args: list[Any] = [workspace]
        for condition, value in (
            ("status = %s", status),
            ("agent_name = %s", agent_name),
            ("id < %s", before),
        ):
            if value is not None:
                sql += " AND " + condition
                args.append(value)
        rows = await self._fetchall(sql + " ORDER BY id DESC LIMIT %s", (*args, limit))
        return [_run(r) for r in rows]

    # -- leases -----------------------------------------------------------------------

    _UPSERT_LEASE = (
        "INSERT INTO run_locks (run_id, worker_id, expires_at, epoch)"
        " SELECT id, %(worker)s, now() + make_interval(secs => %(ttl)s), 1 FROM {source}"
        " ON CONFLICT (run_id) DO UPDATE SET worker_id = excluded.worker_id,"
        " expires_at = excluded.expires_at, epoch = run_locks.epoch + 1"
        " WHERE run_locks.expires_at <= now()"
        " OR (%(reclaim)s AND run_locks.worker_id = excluded.worker_id)"
        " RETURNING run_id, epoch"
    )

    async def acquire_lease(
        self, run_id: str, worker_id: str, ttl: float, *, reclaim: bool = True
    ) -> Lease | None:
        sql = self._UPSERT_LEASE.format(source="runs WHERE id = %(run)s")
        row = await self._fetchone(
            sql, {"run": run_id, "worker": worker_id, "ttl": ttl, "reclaim": reclaim}
        )
        return None if row is None else Lease(run_id, worker_id, row[1])

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
        rows = await self._fetchall(
            _STEAL.format(statuses=_literal_statuses(statuses)),
            {"worker": worker_id, "ttl": ttl, "limit": limit, "queued": "queued" in statuses},
        )
        return [
            Orphan(r[0], None if r[1] is None else Lease(r[0], worker_id, r[1]), r[2], r[3])
            for r in rows
        ]

    async def heartbeat(self, worker_id: str, started_at: datetime) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(
                "INSERT INTO workers (id, started_at, heartbeat_at) VALUES (%s, %s, now())"
                " ON CONFLICT (id) DO UPDATE SET started_at = excluded.started_at,"
                " heartbeat_at = now(), stopped_at = NULL",
                (worker_id, started_at),
            )

    async def worker_stopped(self, worker_id: str) -> None:
        async with self._pool.connection() as conn:
            await conn.execute("UPDATE workers SET stopped_at = now() WHERE id = %s", (worker_id,))

    async def list_workers(self) -> list[WorkerInfo]:
        rows = await self._fetchall(
            "SELECT w.id, w.started_at, w.heartbeat_at, w.stopped_at,"
            " COALESCE(array_agg(l.run_id ORDER BY l.run_id)"
            "  FILTER (WHERE l.run_id IS NOT NULL), '{}')"
            " FROM workers w LEFT JOIN run_locks l"
            "  ON l.worker_id = w.id AND l.expires_at > now()"
            " GROUP BY w.id ORDER BY w.id"
        )
        return [WorkerInfo(r[0], r[1], r[2], r[3], tuple(r[4])) for r in rows]

    async def runs_leased_by(self, worker_id: str) -> list[str]:
        rows = await self._fetchall(
            "SELECT l.run_id FROM run_locks l JOIN runs r ON r.id = l.run_id"
            " WHERE l.worker_id = %s AND r.status IN ('queued', 'running') ORDER BY r.created_at",
            (worker_id,),
        )
        return [r[0] for r in rows]

    async def renew_lease(self, lease: Lease, ttl: float) -> bool:
        row = await self._fetchone(
            # A lease given up by the commit that finished or parked its run stays given up.
            "UPDATE run_locks SET expires_at = now() + make_interval(secs => %s)"
            " WHERE run_id = %s AND epoch = %s AND expires_at > 'epoch' RETURNING 1",
            (ttl, lease.run_id, lease.epoch),
        )
        return row is not None

    async def release_lease(self, lease: Lease) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(
                # An unfinished run's lease expires now, so the sweep hands the run on; a
                # finished run's leaves the index of unreleased leases.
                "UPDATE run_locks l SET expires_at = CASE WHEN r.status IN ('queued', 'running')"
                " THEN now() ELSE 'epoch' END FROM runs r"
                " WHERE r.id = l.run_id AND l.run_id = %s AND l.epoch = %s",
                (lease.run_id, lease.epoch),
            )

    # -- journal ----------------------------------------------------------------------

    async def start_run(
        self,
        run_id: str,
        worker_id: str,
        ttl: float,
        events: Sequence[NewEvent],
        update: RunUpdate,
    ) -> Lease | None:
        params = {
            "run": run_id,
            "worker": worker_id,
            "ttl": ttl,
            "release": update.status in TERMINAL,
            "events": dumps(_event_rows(events)),
            "blobs": _blob_rows(events),
            "status": update.status,
            "output": _json_or_none(update.output),
            "error": _json_or_none(update.error),
        }
        try:
            row = await self._fetchone(_START_RUN, params)
        except psycopg.errors.IntegrityError:
            return None  # the same worker id raced itself to start it; the other one did
        return None if row is None else Lease(run_id, worker_id, row[0])

    async def claim_delivery(self, lease: Lease, delivery: Delivery) -> Delivery:
        row = await self._fetchone(
            _CLAIM,
            {
                "run": lease.run_id,
                "epoch": lease.epoch,
                "step": delivery.step_id,
                "name": delivery.name,
                "attempt": delivery.attempt,
                "key": delivery.idempotency_key,
                "kind": delivery.kind,
                "target": delivery.target,
            },
        )
        if row is None:
            raise LeaseLost(lease.run_id, lease.epoch)
        return Delivery(*row)

    async def finish_delivery(
        self, lease: Lease, delivery: Delivery, status: DeliveryStatus, response: Any
    ) -> None:
        row = await self._fetchone(
            _FINISH,
            {
                "run": lease.run_id,
                "epoch": lease.epoch,
                "step": delivery.step_id,
                "name": delivery.name,
                "status": status,
                "response": _json_or_none(response),
            },
        )
        if row is None:
            raise LeaseLost(lease.run_id, lease.epoch)

    async def deliveries(self, run_id: str) -> list[Delivery]:
        rows = await self._fetchall(
            f"SELECT {_RECEIPT_COLUMNS} FROM side_effect_receipts WHERE run_id = %s"
            " ORDER BY claimed_at, step_id, delivery",
            (run_id,),
        )
        return [Delivery(*r) for r in rows]

    async def append(self, batch: Append) -> None:
        await self._commits.submit(batch)

    async def _append_batch(self, batch: Sequence[Append]) -> list[BaseException | None]:
        try:
            won = await self._write(batch)
        except psycopg.errors.IntegrityError as exc:
            if len(batch) == 1:
                return [_refused(batch[0], exc)]
            # Isolate the offender so the other runs' events still land.
            return [await self._append_alone(item) for item in batch]
        return [
            None if a.lease.run_id in won else LeaseLost(a.lease.run_id, a.lease.epoch)
            for a in batch
        ]

    async def _append_alone(self, item: Append) -> BaseException | None:
        try:
            won = await self._write([item])
        except psycopg.errors.IntegrityError as exc:
            return _refused(item, exc)
        return None if won else LeaseLost(item.lease.run_id, item.lease.epoch)

    async def _write(self, batch: Sequence[Append]) -> set[str]:
        events: list[dict[str, Any]] = []
        updates: list[dict[str, Any]] = []
        for item in batch:
            events += _event_rows(item.events, item.lease.run_id, item.lease.epoch)
            u = item.update
            if u is not None:
                updates.append(
                    {
                        "run_id": item.lease.run_id,
                        "epoch": item.lease.epoch,
                        "status": u.status,
                        "output": u.output,
                        "error": u.error,
                        "release": u.releases,
                        "wake_at": None if u.wake_at is None else u.wake_at.isoformat(),
                    }
                )
        params = {
            "events": dumps(events),
            "blobs": _blob_rows(e for item in batch for e in item.events),
            "updates": dumps(updates),
        }
        rows = await self._writer_execute(_APPEND, params)
        return {r[0] for r in rows}

    async def _writer_execute(self, sql: str, params: dict[str, Any]) -> list[TupleRow]:
        """Journal writes go through one dedicated connection, kept warm.

        Group commit already writes one batch at a time, and a pool would rotate the writes
        through every connection, each with cold caches and its own prepared statements.
        """
        if self._writer is None or self._writer.closed:
            self._writer = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        try:
            cur = await self._writer.execute(sql.encode(), params)
            return await cur.fetchall()
        except psycopg.OperationalError:
            await self._writer.close()
            self._writer = None
            raise

    async def events(self, run_id: str, *, after: int = 0, blobs: bool = False) -> list[Event]:
        if blobs:
            cols = ", ".join("e." + c for c in _EVENT_COLUMNS.split(", "))
            rows = await self._fetchall(
                f"SELECT {cols}, b.body FROM journal_events e"
                " LEFT JOIN blobs b ON b.digest = e.blob_digest"
                " WHERE e.run_id = %s AND e.seq > %s ORDER BY e.seq",
                (run_id, after),
            )
            return [_event(r[:10], bytes(r[10]) if r[10] is not None else None) for r in rows]
        rows = await self._fetchall(
            f"SELECT {_EVENT_COLUMNS} FROM journal_events WHERE run_id = %s AND seq > %s"
            " ORDER BY seq",
            (run_id, after),
        )
        return [_event(r) for r in rows]

    # -- run control: parked runs, approvals, sub-agents ------------------------------

    async def decide(self, decision: Decision) -> bool:
        d = decision
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "INSERT INTO approvals (run_id, node_id, decision, decided_by, comment)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (d.run_id, d.node_id, d.decision, d.decided_by, d.comment),
            )
            if not cur.rowcount:
                return False
            await conn.execute(
                "UPDATE runs SET wake_at = now() WHERE id = %s AND status = 'waiting'",
                (d.run_id,),
            )
        return True

    async def decisions(self, run_id: str) -> dict[str, Decision]:
        rows = await self._fetchall(
            "SELECT run_id, node_id, decision, decided_by, comment, decided_at"
            " FROM approvals WHERE run_id = %s",
            (run_id,),
        )
        return {r[1]: Decision(*r) for r in rows}

    async def wake(self, run_id: str) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(
                "UPDATE runs SET wake_at = now() WHERE id = %s AND status = 'waiting'", (run_id,)
            )

    async def children(self, run_id: str) -> list[Run]:
        rows = await self._fetchall(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE parent_run_id = %s ORDER BY id", (run_id,)
        )
        return [_run(r) for r in rows]

    async def recent_step_usage(
        self, workspace: str, agent_name: str, runs: int = 50
    ) -> list[tuple[str, dict[str, Any]]]:
        rows = await self._fetchall(
            "SELECT e.step_id, e.data->'output'->'usage' FROM journal_events e"
            " WHERE e.run_id IN (SELECT id FROM runs WHERE workspace = %s AND agent_name = %s"
            "  AND status = 'succeeded' ORDER BY id DESC LIMIT %s)"
            " AND e.kind = 'step_completed'"
            " AND jsonb_typeof(e.data->'output'->'usage') = 'object'",
            (workspace, agent_name, runs),
        )
        return [(r[0], r[1]) for r in rows]

    # -- webhook signing secrets ------------------------------------------------------

    async def signing_secrets(self, workspace: str) -> list[str]:
        row = await self._fetchone(
            "SELECT secret, CASE WHEN previous_until > now() THEN previous_secret END"
            " FROM signing_secrets WHERE workspace = %s",
            (workspace,),
        )
        return [] if row is None else [s for s in row if s is not None]

    async def ensure_signing_secret(self, workspace: str, secret: str) -> str:
        async with self._pool.connection() as conn:
            await conn.execute(
                "INSERT INTO signing_secrets (workspace, secret) VALUES (%s, %s)"
                " ON CONFLICT (workspace) DO NOTHING",
                (workspace, secret),
            )
            # A statement of its own: its snapshot sees a row a concurrent first use committed.
            cur = await conn.execute(
                "SELECT secret FROM signing_secrets WHERE workspace = %s", (workspace,)
            )
            row = await cur.fetchone()
        assert row is not None
        return str(row[0])

    async def rotate_signing_secret(self, workspace: str, secret: str, overlap_s: float) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(
                "INSERT INTO signing_secrets (workspace, secret) VALUES (%(ws)s, %(secret)s)"
                " ON CONFLICT (workspace) DO UPDATE SET secret = excluded.secret,"
                " created_at = now(),"
                " previous_secret = CASE WHEN %(keep)s THEN signing_secrets.secret END,"
                " previous_until = CASE WHEN %(keep)s"
                "  THEN now() + make_interval(secs => %(overlap)s) END",
                {
                    "ws": workspace,
                    "secret": secret,
                    "keep": overlap_s > 0,
                    "overlap": float(overlap_s),
                },
            )

    # -- receipts ---------------------------------------------------------------------

    async def journal_head(self, run_id: str) -> tuple[int, str | None]:
        row = await self._fetchone(
            "SELECT COUNT(*), (SELECT hash FROM journal_events WHERE run_id = %(run)s"
            " ORDER BY seq DESC LIMIT 1) FROM journal_events WHERE run_id = %(run)s",
            {"run": run_id},
        )
        assert row is not None
        return int(row[0]), row[1]

    async def register_signing_key(self, kid: str, x: str) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(
                "INSERT INTO signing_keys (kid, x) VALUES (%s, %s) ON CONFLICT (kid) DO NOTHING",
                (kid, x),
            )

    async def signing_keys(self) -> list[SigningKey]:
        rows = await self._fetchall(
            "SELECT kid, x, created_at FROM signing_keys ORDER BY created_at, kid"
        )
        return [SigningKey(*r) for r in rows]

    async def put_receipt(self, receipt: StoredReceipt) -> StoredReceipt:
        r = receipt
        async with self._pool.connection() as conn:
            await conn.execute(
                "INSERT INTO receipts (run_id, key_id, body, signature) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (run_id) DO NOTHING",
                (r.run_id, r.key_id, r.body, r.signature),
            )
            # A statement of its own: its snapshot sees a receipt a concurrent issuer committed.
            cur = await conn.execute(
                "SELECT run_id, key_id, body, signature, created_at FROM receipts"
                " WHERE run_id = %s",
                (r.run_id,),
            )
            row = await cur.fetchone()
        assert row is not None
        return StoredReceipt(*row)

    async def get_receipt(self, run_id: str) -> StoredReceipt | None:
        row = await self._fetchone(
            "SELECT run_id, key_id, body, signature, created_at FROM receipts WHERE run_id = %s",
            (run_id,),
        )
        return None if row is None else StoredReceipt(*row)
