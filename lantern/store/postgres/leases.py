"""Leases on runs, the sweep that steals expired ones, and worker heartbeats.

Leases use the database's clock (``now()``), so replicas with skewed clocks agree on expiry.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from lantern.store.postgres.connection import PostgresConnection
from lantern.store.records import ACTIVE, Lease, Orphan, RunStatus, WorkerInfo

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
), fair AS (
    -- Fair across workspaces: the oldest queued run of each workspace in turn, starting with
    -- the workspace served least recently, so one tenant's backlog cannot starve the others.
    -- (A window cannot be locked, so the runs it picks are locked below.)
    SELECT id FROM (
        SELECT r.id, r.created_at,
               row_number() OVER (PARTITION BY r.workspace ORDER BY r.created_at) AS turn,
               COALESCE(c.claimed_at, 'epoch') AS served
        FROM runs r LEFT JOIN workspace_claims c ON c.workspace = r.workspace
        WHERE r.status = 'queued' AND %(queued)s
          AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id)
    ) q ORDER BY turn, served, created_at LIMIT %(limit)s
), unleased AS (
    SELECT r.id, NULL::text AS previous_worker, NULL::timestamptz AS expired_at
    FROM runs r
    WHERE r.id IN (SELECT id FROM fair) AND r.status = 'queued'
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
), served AS (
    INSERT INTO workspace_claims (workspace, claimed_at)
    SELECT DISTINCT r.workspace, now() FROM unleased u JOIN runs r ON r.id = u.id
    ON CONFLICT (workspace) DO UPDATE SET claimed_at = excluded.claimed_at
)
SELECT f.id, s.epoch, f.previous_worker, f.expired_at
FROM found f LEFT JOIN stolen s ON s.run_id = f.id
"""


def _literal_statuses(statuses: tuple[RunStatus, ...]) -> str:
    assert all(s in ACTIVE for s in statuses), statuses  # literals, never caller text
    return ", ".join(f"'{s}'" for s in statuses)


class Leases(PostgresConnection):
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
        async with self._connection() as conn:
            await conn.execute(
                "INSERT INTO workers (id, started_at, heartbeat_at) VALUES (%s, %s, now())"
                " ON CONFLICT (id) DO UPDATE SET started_at = excluded.started_at,"
                " heartbeat_at = now(), stopped_at = NULL",
                (worker_id, started_at),
            )

    async def worker_stopped(self, worker_id: str) -> None:
        async with self._connection() as conn:
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
            " WHERE l.worker_id = %s AND (r.status IN ('queued', 'running')"
            # A parked run claimed when it was woken, and not opened yet: its lease is not
            # given up (a park gives it up), and nobody else may claim it until it expires.
            "  OR (r.status = 'waiting' AND l.expires_at > 'epoch')) ORDER BY r.created_at",
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

    async def renew_leases(self, leases: Sequence[Lease], ttl: float) -> set[str]:
        if not leases:
            return set()
        rows = await self._fetchall(
            "UPDATE run_locks l SET expires_at = now() + make_interval(secs => %s)"
            " FROM unnest(%s::text[], %s::bigint[]) AS x(run_id, epoch)"
            " WHERE l.run_id = x.run_id AND l.epoch = x.epoch AND l.expires_at > 'epoch'"
            " RETURNING l.run_id",
            (ttl, [lease.run_id for lease in leases], [lease.epoch for lease in leases]),
        )
        return {r[0] for r in rows}

    async def release_lease(self, lease: Lease) -> None:
        await self._fetchall(
            # An unfinished run's lease expires now, so the sweep hands the run on; a
            # finished run's leaves the index of unreleased leases.
            "UPDATE run_locks l SET expires_at = CASE WHEN r.status IN ('queued', 'running')"
            " THEN now() ELSE 'epoch' END FROM runs r"
            " WHERE r.id = l.run_id AND l.run_id = %s AND l.epoch = %s RETURNING l.run_id",
            (lease.run_id, lease.epoch),
            # Sent again across a lost connection (a pooled one the server ended): fenced on
            # the epoch, a second release changes nothing, and a release lost would leave
            # the run held until the lease expires.
            again=True,
        )
