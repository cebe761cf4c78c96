"""Leases on runs, the sweep that steals expired ones, and worker heartbeats."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Container, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from lantern.store.claims import (
    Candidate,
    Entry,
    Group,
    Slots,
    Walk,
    admits,
    marks,
    own_candidate,
    own_counts_args,
    pick,
)
from lantern.store.records import ACTIVE, Lease, Orphan, RunStatus, WorkerInfo
from lantern.store.sqlite.connection import SQLiteConnection
from lantern.store.sqlite.rows import _time

_SERVED = (
    "INSERT INTO workspace_claims (workspace, claimed_at) VALUES (?, ?)"
    " ON CONFLICT (workspace) DO UPDATE SET claimed_at = excluded.claimed_at"
)
_COLUMNS = "id, workspace, agent_name, priority, created_at, flow_key, flow_limit, flow_max"
_UNLEASED = "NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id)"


# The workspaces with shown flow runs, and one workspace's shown flow runs in start order
# (runs_flow_heads; migration 0029, lantern/store/claims.py Walk).
_SHOWN = (
    "SELECT workspace FROM runs INDEXED BY runs_flow_heads WHERE status = 'queued'"
    " AND flow_key IS NOT NULL AND flow_passed IS NULL AND workspace > ?"
    " ORDER BY workspace LIMIT 1"
)
_WALK = (
    "SELECT r.id, r.workspace, r.agent_name, r.flow_key, r.flow_limit, r.flow_max,"
    " EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id)"
    " FROM runs r INDEXED BY runs_flow_heads WHERE r.workspace = ? AND r.status = 'queued'"
    " AND r.flow_key IS NOT NULL AND r.flow_passed IS NULL"
    " ORDER BY r.priority DESC, r.created_at"
)
# Show a group's next queued run not leased.
_SHOW = (
    "UPDATE runs SET flow_passed = NULL WHERE id = (SELECT r.id FROM runs r"
    " WHERE r.workspace = ? AND r.agent_name = ? AND r.flow_key = ? AND r.status = 'queued'"
    f" AND {_UNLEASED} ORDER BY r.priority DESC, r.created_at LIMIT 1)"
    " AND flow_passed IS NOT NULL"
)


def _claimable(conn: sqlite3.Connection) -> bool:
    """Whether a claim of queued runs could take any: a queued run, or a parked one due (as
    in PostgreSQL's store, a superset of what it takes)."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM runs WHERE status = 'queued')"
        " OR EXISTS (SELECT 1 FROM runs WHERE status = 'waiting' AND wake_at <= ?)",
        (time.time(),),
    ).fetchone()
    return bool(row[0])


def _candidates(
    conn: sqlite3.Connection, now: float, limit: int
) -> tuple[list[Candidate], list[Candidate], list[tuple[Group, int]], dict[str, float], list[Walk]]:
    """The claim's candidates, as Postgres reads them in one statement (postgres/leases.py):
    here one indexed probe at a time, each a few microseconds in process."""
    held = [
        ((w, a, k), n)
        for w, a, k, n in conn.execute(
            "SELECT workspace, agent_name, flow_key, count(*) FROM run_locks"
            " WHERE flow_key IS NOT NULL AND expires_at > 0"
            " GROUP BY workspace, agent_name, flow_key"
        )
    ]
    queued: list[Candidate] = []
    workspace = _value(
        conn.execute(
            "SELECT workspace FROM runs WHERE status = 'queued' AND flow_key IS NULL"
            " ORDER BY workspace LIMIT 1"
        ).fetchall()
    )
    while workspace is not None:
        queued += [
            Candidate(*r)
            for r in conn.execute(
                f"SELECT {_COLUMNS} FROM runs r WHERE workspace = ? AND status = 'queued'"
                f" AND flow_key IS NULL AND {_UNLEASED} ORDER BY priority DESC, created_at"
                " LIMIT ?",
                (workspace, limit),
            )
        ]
        workspace = _value(
            conn.execute(
                "SELECT workspace FROM runs WHERE status = 'queued' AND flow_key IS NULL"
                " AND workspace > ? ORDER BY workspace LIMIT 1",
                (workspace,),
            ).fetchall()
        )
    walks: list[Walk] = []
    workspace = _value(conn.execute(_SHOWN, ("",)).fetchall())
    while workspace is not None:
        walk = Walk(Slots(held), limit)
        walks.append(walk)
        rows = conn.execute(_WALK, (workspace,))
        walk.feed(
            Entry(i, (w, a, k), bool(leased), lim, most) for i, w, a, k, lim, most, leased in rows
        )
        rows.close()
        for (w, a, k), n in walk.open:
            queued += [
                Candidate(*r)
                for r in conn.execute(
                    f"SELECT {_COLUMNS} FROM runs r WHERE workspace = ? AND agent_name = ?"
                    " AND flow_key = ? AND status = 'queued'"
                    f" AND {_UNLEASED} ORDER BY priority DESC, created_at LIMIT ?",
                    (w, a, k, n),
                )
            ]
        workspace = _value(conn.execute(_SHOWN, (workspace,)).fetchall())
    woken = [
        replace(Candidate(*r), woken=True)
        for r in conn.execute(
            f"SELECT {_COLUMNS} FROM runs r WHERE status = 'waiting' AND wake_at <= ?"
            " AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id"
            " AND l.expires_at > ?) ORDER BY wake_at LIMIT ?",
            (now, now, limit),
        )
    ]
    spaces = sorted({c.workspace for c in queued})
    served = dict(
        conn.execute(
            "SELECT workspace, claimed_at FROM workspace_claims"
            f" WHERE workspace IN ({','.join('?' * len(spaces))})",
            spaces,
        ).fetchall()
    )
    return queued, woken, held, served, walks


def _mark(conn: sqlite3.Connection, walks: list[Walk], chosen: list[Candidate]) -> None:
    """Hide what the claim's walks passed; show the next queued run of each group it took a
    run from (read after the leases, so not the taken one)."""
    hide, show = marks(walks, chosen)
    conn.executemany(
        "UPDATE runs SET flow_passed = 1 WHERE id = ? AND flow_passed IS NULL", [(i,) for i in hide]
    )
    conn.executemany(_SHOW, show)


# One run's start on its own (Store.claim_run), as in postgres/leases.py.
_ONE = f"SELECT {_COLUMNS}, status FROM runs WHERE id = ?"
_ON_ITS_OWN = """
SELECT
  (SELECT count(*) FROM run_locks
   WHERE workspace = :ws AND agent_name = :agent AND flow_key = :key
     AND expires_at > 0 AND run_id <> :run),
  (SELECT count(*) FROM run_locks
   WHERE workspace = :ws AND agent_name = :agent AND flow_key IS NOT NULL
     AND expires_at > 0 AND run_id <> :run),
  (SELECT count(*) FROM (
     SELECT 1 FROM runs r
     WHERE :queued AND r.workspace = :ws AND r.agent_name = :agent AND r.flow_key = :key
       AND r.status = 'queued'
       AND (r.priority > :priority
            OR (r.priority = :priority AND (r.created_at, r.id) < (:at, :run)))
       AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id)
     LIMIT :reach))
"""


def _one(rows: list[Any]) -> Any:
    # fetchall, not fetchone: a statement left unfinished is compiled again by the next call.
    return rows[0] if rows else None


def _value(rows: list[Any]) -> Any:
    return rows[0][0] if rows else None


class Leases(SQLiteConnection):
    # Wins a free or expired lease; ``reclaim`` also lets a worker id take back its own.
    _UPSERT_LEASE = (
        "INSERT INTO run_locks (run_id, worker_id, expires_at, epoch, workspace, agent_name,"
        " flow_key) SELECT id, ?, ?, 1, workspace, agent_name, flow_key FROM runs WHERE id = ?"
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
            self._UPSERT_LEASE, (worker_id, now + ttl, run_id, now, reclaim)
        ).fetchone()
        return None if row is None else Lease(run_id, worker_id, int(row[0]))

    async def acquire_lease(
        self, run_id: str, worker_id: str, ttl: float, *, reclaim: bool = True
    ) -> Lease | None:
        return await self._write(lambda c: self._upsert_lease(c, run_id, worker_id, ttl, reclaim))

    async def claim_runs(
        self,
        worker_id: str,
        ttl: float,
        limit: int,
        statuses: tuple[RunStatus, ...],
        *,
        skip: Container[str] = frozenset(),
    ) -> list[Lease]:
        if statuses == ("queued",) and not await self._lookup(_claimable):
            return []  # (on this thread: the claim is a write transaction on the writer's)
        orphans = await self._steal(worker_id, ttl, limit, statuses, skip)
        return [o.lease for o in orphans if o.lease is not None]

    async def recover_orphans(self, worker_id: str, ttl: float, limit: int) -> list[Orphan]:
        return await self._steal(worker_id, ttl, limit, ACTIVE)

    async def _steal(
        self,
        worker_id: str,
        ttl: float,
        limit: int,
        statuses: tuple[RunStatus, ...],
        skip: Container[str] = frozenset(),
    ) -> list[Orphan]:
        # Expired leases (oldest expiry first), then what lantern/store/claims.py picks from
        # the candidates read as in Postgres (see there), in one write transaction.
        marks = ",".join("?" * len(statuses))
        expired = (
            "SELECT r.id, l.worker_id, l.expires_at FROM run_locks l"
            " JOIN runs r ON r.id = l.run_id"
            f" WHERE l.expires_at > 0 AND l.expires_at <= ? AND r.status IN ({marks})"
            " ORDER BY l.expires_at LIMIT ?"
        )

        def tx(conn: sqlite3.Connection) -> list[Orphan]:
            now = time.time()
            found = conn.execute(expired, (now, *statuses, limit)).fetchall()
            orphans = [
                Orphan(
                    run_id,
                    self._upsert_lease(conn, run_id, worker_id, ttl, False),
                    previous,
                    _time(expired_at),
                )
                for run_id, previous, expired_at in found
            ]
            if "queued" not in statuses or len(orphans) >= limit:
                return orphans
            queued, woken, held, served, walks = _candidates(conn, now, limit - len(orphans))
            queued = [c for c in queued if c.id not in skip]
            chosen = pick(queued, woken, held, served, limit - len(orphans))
            for c in chosen:
                lease = self._upsert_lease(conn, c.id, worker_id, ttl, False)
                if lease is None:
                    continue
                orphans.append(Orphan(c.id, lease, None, None))
                if not c.woken:
                    conn.execute(_SERVED, (c.workspace, now))
            _mark(conn, walks, chosen)
            return orphans

        return await self._write(tx)

    async def claim_run(self, run_id: str, worker_id: str, ttl: float) -> Lease | None:
        def tx(conn: sqlite3.Connection) -> Lease | None:
            run = own_candidate(_one(conn.execute(_ONE, (run_id,)).fetchall()))
            if run is None:
                return None
            if run.flow_key is not None:
                counts = conn.execute(_ON_ITS_OWN, own_counts_args(run)).fetchall()[0]
                group_held, agent_held, ahead = counts
                if not admits(run, ahead, group_held, agent_held):
                    return None
            lease = self._upsert_lease(conn, run_id, worker_id, ttl, False)
            if lease is not None and not run.woken:
                conn.execute(_SERVED, (run.workspace, time.time()))
                _mark(conn, [], [run])
            return lease

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
