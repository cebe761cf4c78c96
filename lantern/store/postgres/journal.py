"""The journal: a run's start, fenced appends under group commit, events and deliveries.

A journal append is one statement: it takes a share lock on the writer's lease row at the
writer's epoch, inserts the events only if that row exists, and updates the run, so a steal
(which updates the lease row) and a fenced write are strictly ordered. A group commit carries
many appends, so each is fenced on its own (run, epoch): an append of a superseded epoch never
lands because another append of the same run, at the current epoch, shares its statement.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import psycopg

from lantern.errors import LeaseLost, QueueFull, StoreError
from lantern.store.codec import dumps
from lantern.store.group_commit import GroupCommitter
from lantern.store.postgres.connection import PostgresConnection
from lantern.store.postgres.quotas import QUEUE_FULL
from lantern.store.postgres.rows import _EVENT_COLUMNS, _RECEIPT_COLUMNS, _event
from lantern.store.postgres.runs import _CREATE_RUN, create_args, created_row, flow_args, refused
from lantern.store.records import (
    TERMINAL,
    Append,
    Delivery,
    DeliveryStatus,
    Event,
    FlowOf,
    Lease,
    NewEvent,
    Run,
    RunFlow,
    RunUpdate,
)

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
        wake_at timestamptz, waiting_for text)
), fenced AS (
    SELECT l.run_id, l.epoch FROM run_locks l
    JOIN (SELECT run_id, epoch FROM batch UNION SELECT run_id, epoch FROM updates) w
      ON w.run_id = l.run_id AND w.epoch = l.epoch
    FOR SHARE OF l
), stored_blobs AS (
    INSERT INTO blobs (digest, body)
    SELECT digest, decode(body, 'base64')
    FROM json_to_recordset(%(blobs)s::json) AS x(digest text, body text) ORDER BY digest
    -- An upsert, not DO NOTHING: it locks a blob a deletion may be removing (see retention.py)
    ON CONFLICT (digest) DO UPDATE SET digest = excluded.digest
), inserted AS (
    INSERT INTO journal_events
        (run_id, seq, kind, at, data, step_id, node_id, attempt, blob_digest, hash)
    SELECT run_id, seq, kind, at, data, step_id, node_id, attempt, blob_digest, hash
    FROM batch WHERE (run_id, epoch) IN (SELECT run_id, epoch FROM fenced)
), updated AS (
    UPDATE runs r SET status = u.status, output = u.output, error = u.error, updated_at = now(),
                      wake_at = u.wake_at, waiting_for = u.waiting_for
    FROM updates u
    WHERE r.id = u.run_id AND (u.run_id, u.epoch) IN (SELECT run_id, epoch FROM fenced)
), woken AS (
    -- A parent parked on a finished sub-agent is due now. The parent's row is updated (so
    -- locked) whatever its status: a parent committing its park meanwhile is waited for and
    -- then seen waiting, or waits for this commit and then sees the child finished when it
    -- looks once more. Filtering on status = 'waiting' here skipped a parent whose park was
    -- in flight, and the parent then waited for ever. A parent in this same batch is left
    -- to that second look: two updates of one row in one statement are not allowed. A
    -- finished parent is left alone (no write, no lock).
    UPDATE runs p SET wake_at = CASE WHEN p.status = 'waiting' THEN now() ELSE p.wake_at END
    FROM updates u JOIN runs c ON c.id = u.run_id
    WHERE u.status IN ('succeeded', 'failed', 'cancelled') AND p.id = c.parent_run_id
      AND p.status IN ('running', 'waiting')
      AND p.id NOT IN (SELECT run_id FROM updates)
      AND (u.run_id, u.epoch) IN (SELECT run_id, epoch FROM fenced)
), released AS (
    UPDATE run_locks l SET expires_at = 'epoch'
    FROM updates u
    WHERE u.release AND l.run_id = u.run_id
      AND (u.run_id, u.epoch) IN (SELECT run_id, epoch FROM fenced)
)
SELECT run_id, epoch FROM fenced
"""

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

# Lease a never-started run and write its opening events in one statement: the events and
# the run update land only if the lease row was won.
_START_RUN = """
WITH lease AS (
    INSERT INTO run_locks (run_id, worker_id, expires_at, epoch, workspace, agent_name, flow_key)
    SELECT id, %(worker)s,
           CASE WHEN %(release)s THEN 'epoch' ELSE now() + make_interval(secs => %(ttl)s) END, 1,
           workspace, agent_name, flow_key
    FROM runs
    WHERE id = %(run)s AND status = 'queued'
      AND NOT EXISTS (SELECT 1 FROM journal_events WHERE run_id = %(run)s)
    -- The run's row first, then its lease, in the order a claim takes them: leased first, a
    -- claim choosing the run at the same moment held the run and waited for the lease while
    -- this statement held the lease and waited for the run (deadlock_timeout, 1 s, for one
    -- of them to be aborted).
    FOR NO KEY UPDATE
    ON CONFLICT (run_id) DO UPDATE SET worker_id = excluded.worker_id,
        expires_at = excluded.expires_at, epoch = run_locks.epoch + 1
    WHERE run_locks.expires_at <= now() OR run_locks.worker_id = excluded.worker_id
    RETURNING run_id, epoch
), stored_blobs AS (
    INSERT INTO blobs (digest, body)
    SELECT digest, decode(body, 'base64')
    FROM json_to_recordset(%(blobs)s::json) AS x(digest text, body text) ORDER BY digest
    -- An upsert, not DO NOTHING: it locks a blob a deletion may be removing (see retention.py)
    ON CONFLICT (digest) DO UPDATE SET digest = excluded.digest
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
), started AS (
    SELECT r.workspace FROM runs r JOIN lease l ON l.run_id = r.id
), served AS (
    -- Starting a queued run serves its workspace, as a claim does, so a run a replica drives
    -- at its create still counts in the claim's fairness between workspaces. Not when
    -- another transaction is marking it served this very moment (SKIP LOCKED): waiting for
    -- that one's commit put every start of one workspace in a single file behind the one
    -- before it, an fsync each, and the mark it sets is as recent as ours would be.
    UPDATE workspace_claims SET claimed_at = now()
    WHERE workspace IN (
        SELECT c.workspace FROM workspace_claims c JOIN started s ON s.workspace = c.workspace
        FOR UPDATE OF c SKIP LOCKED)
), first_served AS (
    INSERT INTO workspace_claims (workspace, claimed_at)
    SELECT s.workspace, now() FROM started s
    WHERE NOT EXISTS (SELECT 1 FROM workspace_claims c WHERE c.workspace = s.workspace)
    ON CONFLICT (workspace) DO NOTHING
)
SELECT epoch FROM lease
"""


EVENTS = f"SELECT {_EVENT_COLUMNS} FROM journal_events WHERE run_id = %s AND seq > %s ORDER BY seq"
EVENTS_PAGE = EVENTS + " LIMIT %s"  # an index range scan on (run_id, seq): the page, no more


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
    # Each digest once: an upsert may not touch one row twice in a statement.
    blobs = {e.blob.digest: e.blob.body for e in events if e.blob is not None}
    return dumps(
        [{"digest": d, "body": base64.b64encode(b).decode()} for d, b in sorted(blobs.items())]
    )


def _start_params(
    run_id: str, worker_id: str, ttl: float, events: Sequence[NewEvent], update: RunUpdate
) -> dict[str, Any]:
    return {
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


def _refused(item: Append, exc: Exception) -> StoreError:
    return StoreError(f"run {item.lease.run_id}: journal write refused: {exc}")


def _json_or_none(value: Any) -> str | None:
    return None if value is None else dumps(value)


class Journal(PostgresConnection):
    def __init__(self, url: str, *, max_connections: int = 10) -> None:
        super().__init__(url, max_connections=max_connections)
        self._commits = GroupCommitter[Append](self._append_batch)

    async def start_run(
        self,
        run_id: str,
        worker_id: str,
        ttl: float,
        events: Sequence[NewEvent],
        update: RunUpdate,
    ) -> Lease | None:
        try:
            row = await self._fetchone(
                _START_RUN, _start_params(run_id, worker_id, ttl, events, update)
            )
        except psycopg.errors.IntegrityError:
            return None  # the same worker id raced itself to start it; the other one did
        if row is None:
            return None
        if events:
            self.notifier.committed(run_id, events[-1].seq, update.status in TERMINAL)
        return Lease(run_id, worker_id, row[0])

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
        args = create_args(run, idempotency_key, request_digest, flow)
        settled: RunFlow | None = None
        started = None
        try:
            async with self._connection() as conn, conn.transaction():
                cur = await conn.execute(_CREATE_RUN.encode(), args)
                row = created_row(run, await cur.fetchone())
                if not row[3]:  # under flow control: stored queued, for a claim to count
                    settled, args = flow_args(args, flow, row)
                    cur = await conn.execute(_CREATE_RUN.encode(), args)
                    row = created_row(run, await cur.fetchone())
                elif row[0] == run.agent_version:
                    params = _start_params(run.id, worker_id, ttl, events, update)
                    cur = await conn.execute(_START_RUN.encode(), params)
                    started = await cur.fetchone()
                if started is None and max_queued is not None:
                    # Left queued, for whoever takes it as any other run: it waits in the queue.
                    full = {"workspace": run.workspace, "id": run.id, "at_most": max_queued}
                    cur = await conn.execute(QUEUE_FULL.encode(), full)
                    if (await cur.fetchone()) == (True,):
                        raise QueueFull  # and the insert is rolled back
        except psycopg.errors.UniqueViolation as exc:
            raise refused(run, idempotency_key, exc) from exc
        stored = replace(run, agent_version=row[0], flow=settled)
        if started is None:
            return stored, None
        if events:
            self.notifier.committed(run.id, events[-1].seq, update.status in TERMINAL)
        return replace(stored, status=update.status), Lease(run.id, worker_id, started[0])

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
        if batch.events:
            self.notifier.committed(batch.lease.run_id, batch.events[-1].seq, batch.finishes)

    async def _append_batch(self, batch: Sequence[Append]) -> list[BaseException | None]:
        try:
            won = await self._write(batch)
        except psycopg.errors.IntegrityError as exc:
            if len(batch) == 1:
                return [None if await self._landed(batch[0]) else _refused(batch[0], exc)]
            # Isolate the offender so the other runs' events still land.
            return [await self._append_alone(item) for item in batch]
        return [
            None
            if (a.lease.run_id, a.lease.epoch) in won
            else LeaseLost(a.lease.run_id, a.lease.epoch)
            for a in batch
        ]

    async def _append_alone(self, item: Append) -> BaseException | None:
        try:
            won = await self._write([item])
        except psycopg.errors.IntegrityError as exc:
            if await self._landed(item):
                return None
            return _refused(item, exc)
        return None if won else LeaseLost(item.lease.run_id, item.lease.epoch)

    async def _landed(self, item: Append) -> bool:
        """Whether this very append is already stored: sent again after a commit whose answer
        was lost, its events collide with themselves (same run, seq and hash)."""
        if not item.events or item.events[-1].hash is None:
            return False  # an unchained event cannot be told from another at its seq
        last = item.events[-1]
        row = await self._fetchone(
            "SELECT hash FROM journal_events WHERE run_id = %s AND seq = %s",
            (item.lease.run_id, last.seq),
        )
        return row is not None and row[0] == last.hash

    async def _write(self, batch: Sequence[Append]) -> set[tuple[str, int]]:
        """The (run, epoch) of the appends that landed: those whose lease is current."""
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
                        "waiting_for": u.waiting_for,
                    }
                )
        params = {
            "events": dumps(events),
            "blobs": _blob_rows(e for item in batch for e in item.events),
            "updates": dumps(updates),
        }
        rows = await self._writer_execute(_APPEND, params)
        return {(r[0], r[1]) for r in rows}

    async def events(
        self, run_id: str, *, after: int = 0, limit: int | None = None, blobs: bool = False
    ) -> list[Event]:
        # The primary key (run_id, seq) serves both the range and the order: a page costs
        # the page, wherever it starts.
        page = "" if limit is None else " LIMIT %s"
        args: tuple[Any, ...] = (run_id, after) if limit is None else (run_id, after, limit)
        if blobs:
            cols = ", ".join("e." + c for c in _EVENT_COLUMNS.split(", "))
            rows = await self._fetchall(
                f"SELECT {cols}, b.body FROM journal_events e"
                " LEFT JOIN blobs b ON b.digest = e.blob_digest"
                f" WHERE e.run_id = %s AND e.seq > %s ORDER BY e.seq{page}",
                args,
            )
            return [_event(r[:10], bytes(r[10]) if r[10] is not None else None) for r in rows]
        rows = await self._fetchall(EVENTS if limit is None else EVENTS_PAGE, args)
        return [_event(r) for r in rows]
