"""Leases on runs, the sweep that steals expired ones, and worker heartbeats."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from datetime import datetime

from lantern.store.records import ACTIVE, Lease, Orphan, RunStatus, WorkerInfo
from lantern.store.sqlite.connection import SQLiteConnection
from lantern.store.sqlite.rows import _time


class Leases(SQLiteConnection):
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
        # Expired leases (oldest expiry first), then queued runs never leased: as in Postgres.
        marks = ",".join("?" * len(statuses))
        expired = (
            "SELECT r.id, l.worker_id, l.expires_at FROM run_locks l"
            " JOIN runs r ON r.id = l.run_id"
            f" WHERE l.expires_at > 0 AND l.expires_at <= ? AND r.status IN ({marks})"
            " ORDER BY l.expires_at LIMIT ?"
        )
        # Fair across workspaces: the oldest queued run of each workspace in turn, starting
        # with the workspace served least recently, so one tenant's backlog cannot starve
        # the others.
        unleased = (
            "SELECT id, NULL, NULL FROM (SELECT r.id, r.created_at, ROW_NUMBER() OVER"
            " (PARTITION BY r.workspace ORDER BY r.created_at) AS turn,"
            " COALESCE(c.claimed_at, 0) AS served FROM runs r"
            " LEFT JOIN workspace_claims c ON c.workspace = r.workspace"
            " WHERE r.status = 'queued'"
            " AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id))"
            " ORDER BY turn, served, created_at LIMIT ?"
        )
        served = (
            "INSERT INTO workspace_claims (workspace, claimed_at)"
            " SELECT DISTINCT workspace, ? FROM runs WHERE id = ?"
            " ON CONFLICT (workspace) DO UPDATE SET claimed_at = excluded.claimed_at"
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
                queued = conn.execute(unleased, (limit - len(found),)).fetchall()
                for row in queued:
                    conn.execute(served, (now, row[0]))
                found += queued
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
            " WHERE l.worker_id = ? AND (r.status IN ('queued', 'running')"
            # A parked run claimed when it was woken, and not opened yet: its lease is not
            # given up (a park gives it up), and nobody else may claim it until it expires.
            "  OR (r.status = 'waiting' AND l.expires_at > 0)) ORDER BY r.created_at"
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

    async def renew_leases(self, leases: Sequence[Lease], ttl: float) -> set[str]:
        sql = (
            "UPDATE run_locks SET expires_at = ? WHERE run_id = ? AND epoch = ? AND expires_at > 0"
        )

        def tx(conn: sqlite3.Connection) -> set[str]:
            until = time.time() + ttl
            return {
                lease.run_id
                for lease in leases
                if conn.execute(sql, (until, lease.run_id, lease.epoch)).rowcount
            }

        return await self._write(tx) if leases else set()

    async def release_lease(self, lease: Lease) -> None:
        # An unfinished run's lease expires now, so the sweep hands the run on; a finished
        # run's leaves the index of unreleased leases.
        sql = (
            "UPDATE run_locks SET expires_at = CASE WHEN (SELECT status FROM runs WHERE id = ?)"
            " IN ('queued', 'running') THEN ? ELSE 0 END WHERE run_id = ? AND epoch = ?"
        )
        args = (lease.run_id, time.time(), lease.run_id, lease.epoch)
        await self._write(lambda c: c.execute(sql, args))
