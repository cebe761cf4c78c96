"""The journal: a run's start, fenced appends under group commit, events and deliveries."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from lantern.errors import LeaseLost, QueueFull, StoreError
from lantern.store.codec import dumps
from lantern.store.group_commit import GroupCommitter
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
from lantern.store.sqlite.leases import Leases
from lantern.store.sqlite.quotas import queue_is_full
from lantern.store.sqlite.rows import _EVENT_COLUMNS, _RECEIPT_COLUMNS, _delivery, _event
from lantern.store.sqlite.runs import created, insert_run, refused

EVENTS = (
    f"SELECT {_EVENT_COLUMNS}, NULL FROM journal_events WHERE run_id = ? AND seq > ? ORDER BY seq"
)
EVENTS_PAGE = EVENTS + " LIMIT ?"  # a range search on the primary key: the page, no more


class Journal(Leases):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._commits = GroupCommitter[Append](self._append_batch)

    async def start_run(
        self,
        run_id: str,
        worker_id: str,
        ttl: float,
        events: Sequence[NewEvent],
        update: RunUpdate,
    ) -> Lease | None:
        lease = await self._write(lambda c: self._start(c, run_id, worker_id, ttl, events, update))
        if lease is not None and events:
            self.notifier.committed(run_id, events[-1].seq, update.status in TERMINAL)
        return lease

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
        def tx(conn: sqlite3.Connection) -> tuple[tuple[int, RunFlow | None] | None, Lease | None]:
            row = insert_run(conn, run, idempotency_key, request_digest, flow)
            lease = None
            if row is not None and row[0] == run.agent_version and row[1] is None:
                lease = self._start(conn, run.id, worker_id, ttl, events, update)
            if row is not None and lease is None and max_queued is not None:
                # Left queued, for whoever takes it as any other run: it waits in the queue.
                if queue_is_full(conn, run.workspace, run.id, max_queued):
                    raise QueueFull  # and the insert is rolled back
            return row, lease

        try:
            row, lease = await self._write(tx)
        except sqlite3.IntegrityError as exc:
            raise refused(run, idempotency_key, exc) from exc
        stored = created(run, row)
        if lease is None:
            return stored, None
        if events:
            self.notifier.committed(run.id, events[-1].seq, update.status in TERMINAL)
        return replace(stored, status=update.status), lease

    def _start(
        self,
        conn: sqlite3.Connection,
        run_id: str,
        worker_id: str,
        ttl: float,
        events: Sequence[NewEvent],
        update: RunUpdate,
    ) -> Lease | None:
        status = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
        journal = conn.execute(
            "SELECT 1 FROM journal_events WHERE run_id = ? LIMIT 1", (run_id,)
        ).fetchone()
        if status is None or status[0] != "queued" or journal is not None:
            return None
        lease = self._upsert_lease(conn, run_id, worker_id, ttl, True)
        if lease is not None:
            _append_one(conn, Append(lease, tuple(events), update))
            # Starting a queued run serves its workspace, as a claim does, so a run a
            # replica drives at its create still counts in the claim's fairness.
            conn.execute(
                "INSERT INTO workspace_claims (workspace, claimed_at)"
                " SELECT workspace, ? FROM runs WHERE id = ?"
                " ON CONFLICT (workspace) DO UPDATE SET claimed_at = excluded.claimed_at",
                (time.time(), run_id),
            )
        return lease

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
        if batch.events:
            self.notifier.committed(batch.lease.run_id, batch.events[-1].seq, batch.finishes)

    async def _append_batch(self, batch: Sequence[Append]) -> list[BaseException | None]:
        if len(batch) == 1:  # alone in its transaction: no savepoint needed
            try:
                return [await self._write(lambda c: _append_one(c, batch[0]))]
            except sqlite3.IntegrityError as exc:
                landed = await self._read(lambda c: _landed(c, batch[0]))
                return [None if landed else _refused(batch[0], exc)]
        return await self._write(lambda c: [_isolated(c, item) for item in batch])

    async def events(
        self, run_id: str, *, after: int = 0, limit: int | None = None, blobs: bool = False
    ) -> list[Event]:
        # The primary key (run_id, seq) serves both the range and the order: a page costs
        # the page, wherever it starts.
        page = "" if limit is None else " LIMIT ?"
        args: tuple[Any, ...] = (run_id, after) if limit is None else (run_id, after, limit)
        if blobs:
            sql = (
                f"SELECT {', '.join('e.' + c for c in _EVENT_COLUMNS.split(', '))}, b.body"
                " FROM journal_events e LEFT JOIN blobs b ON b.digest = e.blob_digest"
                f" WHERE e.run_id = ? AND e.seq > ? ORDER BY e.seq{page}"
            )
        else:
            sql = EVENTS if limit is None else EVENTS_PAGE
        rows = await self._read(lambda c: c.execute(sql, args).fetchall())
        return [_event(r, r[10]) for r in rows]


def _fence(conn: sqlite3.Connection, lease: Lease) -> None:
    row = conn.execute("SELECT epoch FROM run_locks WHERE run_id = ?", (lease.run_id,)).fetchone()
    if row is None or row[0] != lease.epoch:
        raise LeaseLost(lease.run_id, lease.epoch)


def _isolated(conn: sqlite3.Connection, item: Append) -> BaseException | None:
    """One run's append inside a shared transaction: a savepoint keeps a refusal its own."""
    conn.execute("SAVEPOINT one_append")
    outcome: BaseException | None
    try:
        outcome = _append_one(conn, item)
    except sqlite3.IntegrityError as exc:
        conn.execute("ROLLBACK TO one_append")
        outcome = None if _landed(conn, item) else _refused(item, exc)
    conn.execute("RELEASE one_append")
    return outcome


def _landed(conn: sqlite3.Connection, item: Append) -> bool:
    """Whether this very append is already stored (sent again after a failed answer): its
    last event collides with itself, same run, seq and hash."""
    if not item.events or item.events[-1].hash is None:
        return False  # an unchained event cannot be told from another at its seq
    last = item.events[-1]
    row = conn.execute(
        "SELECT hash FROM journal_events WHERE run_id = ? AND seq = ?",
        (item.lease.run_id, last.seq),
    ).fetchone()
    return row is not None and bool(row[0] == last.hash)


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
            "UPDATE runs SET status = ?, output = ?, error = ?, updated_at = ?, wake_at = ?,"
            " waiting_for = ? WHERE id = ?",
            (
                u.status,
                None if u.output is None else dumps(u.output),
                None if u.error is None else dumps(u.error),
                time.time(),
                None if u.wake_at is None else u.wake_at.timestamp(),
                u.waiting_for,
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
