"""Leases on runs, the sweep that steals expired ones, and worker heartbeats.

Leases use the database's clock (``now()``), so replicas with skewed clocks agree on expiry.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from datetime import datetime
from typing import Any

from psycopg.rows import TupleRow

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
from lantern.store.postgres.connection import PostgresConnection
from lantern.store.records import ACTIVE, Lease, Orphan, RunStatus, WorkerInfo

# Runs whose leases expired (through the partial index of unreleased leases, oldest expiry
# first): their holder is gone, and the run (holding its slot, if under flow control) is
# handed on as it is. SKIP LOCKED passes over a run a commit is writing; the UPSERT still wins
# only an expired lease.
_EXPIRED = """
WITH expired AS (
    SELECT r.id, l.worker_id AS previous_worker, l.expires_at AS expired_at
    FROM run_locks l JOIN runs r ON r.id = l.run_id
    WHERE l.expires_at > 'epoch' AND l.expires_at <= now() AND r.status IN ({statuses})
    ORDER BY l.expires_at LIMIT %(limit)s
    FOR NO KEY UPDATE OF r SKIP LOCKED
), stolen AS (
    UPDATE run_locks l SET worker_id = %(worker)s,
        expires_at = now() + make_interval(secs => %(ttl)s), epoch = l.epoch + 1
    FROM expired e WHERE l.run_id = e.id AND l.expires_at <= now()
    RETURNING l.run_id, l.epoch
)
SELECT e.id, s.epoch, e.previous_worker, e.expired_at
FROM expired e LEFT JOIN stolen s ON s.run_id = e.id
"""

# Whether a claim of queued runs could take any: a queued run, or a parked one due (a superset
# of what it takes, so a no is sure). One statement, outside the claim's lock: an idle
# replica's dispatcher asks every 0.2 s, and the claim itself is five round trips (BEGIN, the
# lock, its two reads, COMMIT).
_CLAIMABLE = """
SELECT EXISTS (SELECT 1 FROM runs WHERE status = 'queued')
    OR EXISTS (SELECT 1 FROM runs WHERE status = 'waiting' AND wake_at <= now())
"""

# What a claim chooses from (lantern/store/claims.py), each part through an index and bounded:
# - spaces, groups: the workspaces with queued runs free of flow control, and the flow groups
#   (workspace, agent, key) with queued runs, each found with one index probe (a skip scan), so
#   neither costs more with 100,000 queued runs than with 10;
# - held: the slots each flow group holds (the partial index of unreleased flow leases);
# - the head of each workspace's queue, and of each flow group's queue as deep as its free
#   slots (none for a full group, so a blocked key's backlog is never read);
# - due parked runs, and when each workspace was last served.
_CANDIDATES = """
WITH RECURSIVE spaces AS (
    -- Ordered as runs_queued_free is, so that index is the one read (another index by
    -- workspace would walk a flow-controlled backlog to find the first free run).
    (SELECT workspace FROM runs WHERE status = 'queued' AND flow_key IS NULL
     ORDER BY workspace, priority DESC, created_at LIMIT 1)
    UNION ALL
    SELECT (SELECT r.workspace FROM runs r
            WHERE r.status = 'queued' AND r.flow_key IS NULL AND r.workspace > s.workspace
            ORDER BY r.workspace, r.priority DESC, r.created_at LIMIT 1)
    FROM spaces s WHERE s.workspace IS NOT NULL
), fspaces AS (
    -- The workspaces with shown flow runs (runs_flow_heads), one index probe each.
    (SELECT workspace FROM runs
     WHERE status = 'queued' AND flow_key IS NOT NULL AND flow_passed IS NULL
     ORDER BY workspace, priority DESC, created_at LIMIT 1)
    UNION ALL
    SELECT (SELECT r.workspace FROM runs r
            WHERE r.status = 'queued' AND r.flow_key IS NOT NULL AND r.flow_passed IS NULL
              AND r.workspace > s.workspace
            ORDER BY r.workspace, r.priority DESC, r.created_at LIMIT 1)
    FROM fspaces s WHERE s.workspace IS NOT NULL
), held AS (
    SELECT workspace, agent_name, flow_key, count(*)::int AS n FROM run_locks
    WHERE flow_key IS NOT NULL AND expires_at > 'epoch'
    GROUP BY workspace, agent_name, flow_key
)
SELECT 'held', NULL, workspace, agent_name, flow_key, n, NULL::timestamptz, NULL::int, NULL::int,
       NULL::bool
FROM held
UNION ALL
SELECT 'queued', r.id, r.workspace, r.agent_name, r.flow_key, r.priority, r.created_at,
       r.flow_limit, r.flow_max, NULL
FROM spaces s CROSS JOIN LATERAL (
    SELECT * FROM runs r
    WHERE r.workspace = s.workspace AND r.status = 'queued' AND r.flow_key IS NULL
      AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id)
    ORDER BY r.priority DESC, r.created_at LIMIT %(limit)s) r
WHERE s.workspace IS NOT NULL
UNION ALL
SELECT 'entry', e.id, e.workspace, e.agent_name, e.flow_key, e.priority, e.created_at,
       e.flow_limit, e.flow_max, e.leased
FROM fspaces s CROSS JOIN LATERAL (
    SELECT r.*, EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id) AS leased FROM runs r
    WHERE r.workspace = s.workspace AND r.status = 'queued' AND r.flow_key IS NOT NULL
      AND r.flow_passed IS NULL
    ORDER BY r.priority DESC, r.created_at, r.id LIMIT %(batch)s) e
WHERE s.workspace IS NOT NULL
UNION ALL
SELECT 'woken', w.id, w.workspace, w.agent_name, w.flow_key, w.priority, w.created_at,
       w.flow_limit, w.flow_max, NULL
FROM (SELECT * FROM runs r
      WHERE r.status = 'waiting' AND r.wake_at <= now()
        AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id AND l.expires_at > now())
      ORDER BY r.wake_at LIMIT %(limit)s) w
UNION ALL
SELECT 'served', NULL, c.workspace, NULL, NULL, NULL, c.claimed_at, NULL, NULL, NULL
FROM workspace_claims c
WHERE c.workspace IN (SELECT workspace FROM spaces UNION SELECT workspace FROM fspaces)
"""

# Lease the runs the claim chose (still queued or parked: a cancel may have come between),
# copying each run's flow group into its lease, and mark the workspaces of the queued ones
# served.
_TAKE = """
WITH chosen AS (
    SELECT r.id, r.workspace, r.agent_name, r.flow_key, r.status FROM runs r
    WHERE r.id = ANY(%(ids)s) AND r.status IN ('queued', 'waiting')
    FOR NO KEY UPDATE OF r SKIP LOCKED
), taken AS (
    INSERT INTO run_locks (run_id, worker_id, expires_at, epoch, workspace, agent_name, flow_key)
    SELECT id, %(worker)s, now() + make_interval(secs => %(ttl)s), 1, workspace, agent_name,
           flow_key
    FROM chosen
    ON CONFLICT (run_id) DO UPDATE SET worker_id = excluded.worker_id,
        expires_at = excluded.expires_at, epoch = run_locks.epoch + 1,
        workspace = excluded.workspace, agent_name = excluded.agent_name,
        flow_key = excluded.flow_key
    WHERE run_locks.expires_at <= now()
    RETURNING run_id, epoch
), served AS (
    INSERT INTO workspace_claims (workspace, claimed_at)
    SELECT DISTINCT c.workspace, now() FROM chosen c JOIN taken t ON t.run_id = c.id
    WHERE c.status = 'queued'
    ON CONFLICT (workspace) DO UPDATE SET claimed_at = excluded.claimed_at
-- marking
)
SELECT run_id, epoch FROM taken
"""
# The same, also hiding and showing flow runs (claims.marks): a claim of runs without flow
# control keeps the shorter statement.
_TAKE_MARKING = _TAKE.replace(
    "-- marking\n",
    """), heads AS (
    -- The next queued run of each group a run was taken from, shown (claims.marks); a run a
    -- commit holds is passed over (SKIP LOCKED: that commit may wait for this claim's lock).
    SELECT h.id, h.flow_passed FROM unnest(%(gw)s::text[], %(ga)s::text[], %(gk)s::text[])
        AS g(w, a, k)
    CROSS JOIN LATERAL (
        SELECT r.id, r.flow_passed FROM runs r
        WHERE r.workspace = g.w AND r.agent_name = g.a AND r.flow_key = g.k
          AND r.status = 'queued' AND r.id <> ALL(%(ids)s)
          AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id)
        ORDER BY r.priority DESC, r.created_at LIMIT 1
        FOR NO KEY UPDATE OF r SKIP LOCKED) h
), passed AS (
    SELECT id FROM runs
    WHERE id = ANY(%(hide)s) AND flow_passed IS NULL AND id NOT IN (SELECT id FROM heads)
    FOR NO KEY UPDATE SKIP LOCKED
), marked AS (
    UPDATE runs r SET flow_passed = CASE WHEN r.id = ANY(ARRAY(SELECT id FROM passed)) THEN true END
    -- ANY(ARRAY(...)): a probe of the primary key per run, never a scan of the runs
    WHERE r.id = ANY(ARRAY(SELECT id FROM heads WHERE flow_passed UNION ALL SELECT id FROM passed))
""",
)

# A workspace's shown flow runs past the first batch (claims.Walk), in the same order.
_MORE = """
SELECT r.id, r.workspace, r.agent_name, r.flow_key, r.flow_limit, r.flow_max,
       EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id), r.priority, r.created_at
FROM runs r
WHERE r.workspace = %(ws)s AND r.status = 'queued' AND r.flow_key IS NOT NULL
  AND r.flow_passed IS NULL
  AND (r.priority < %(priority)s
       OR (r.priority = %(priority)s AND (r.created_at, r.id) > (%(at)s, %(id)s)))
ORDER BY r.priority DESC, r.created_at, r.id LIMIT %(batch)s
"""

# The head of each open group's queue, as deep as its free slots (claims.Walk.open).
_HEADS = """
SELECT r.id, r.workspace, r.agent_name, r.priority, r.created_at, r.flow_key, r.flow_limit,
       r.flow_max
FROM unnest(%(gw)s::text[], %(ga)s::text[], %(gk)s::text[], %(n)s::int[]) AS g(w, a, k, n)
CROSS JOIN LATERAL (
    SELECT * FROM runs r
    WHERE r.workspace = g.w AND r.agent_name = g.a AND r.flow_key = g.k
      AND r.status = 'queued' AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id)
    ORDER BY r.priority DESC, r.created_at LIMIT g.n) r
"""
BATCH = 64  # shown runs read per workspace beyond the claim's limit, before reading more

# One run's start on its own (Store.claim_run): the run, then the slots its flow group and
# its agent hold (its own lease left out: a run taken over keeps its slot) and how many runs
# of its group are queued before it, counted only as far as its limits reach.
_ONE = """
SELECT id, workspace, agent_name, priority, created_at, flow_key, flow_limit, flow_max, status
FROM runs WHERE id = %(run)s
"""
_ON_ITS_OWN = """
SELECT
  (SELECT count(*)::int FROM run_locks
   WHERE workspace = %(ws)s AND agent_name = %(agent)s AND flow_key = %(key)s
     AND expires_at > 'epoch' AND run_id <> %(run)s),
  (SELECT count(*)::int FROM run_locks
   WHERE workspace = %(ws)s AND agent_name = %(agent)s AND flow_key IS NOT NULL
     AND expires_at > 'epoch' AND run_id <> %(run)s),
  (SELECT count(*)::int FROM (
     SELECT 1 FROM runs r
     WHERE %(queued)s AND r.workspace = %(ws)s AND r.agent_name = %(agent)s
       AND r.flow_key = %(key)s AND r.status = 'queued'
       AND (r.priority > %(priority)s
            OR (r.priority = %(priority)s AND (r.created_at, r.id) < (%(at)s, %(run)s)))
       AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id)
     LIMIT %(reach)s) a)
"""

# Claims take this lock for their transaction, so two replicas never both count a flow
# group's slots free and both fill them. A claim is one short transaction; the lock is never
# held across a drive or a network call.
_CLAIM_LOCK = 0x4C414E43  # "LANC"
# With it, JIT off for the claim's transaction: the planner's estimate for the walk (every
# shown run of every workspace) passes the JIT threshold, and compiling cost a claim more
# than all its reads (~250 ms on a loaded box with 10,000 queued runs).
_LOCK = (
    b"SELECT pg_advisory_xact_lock(%s), set_config('jit', 'off', true),"
    b" set_config('idle_in_transaction_session_timeout', %s, true)"
)
# And a bound on how long the claim's transaction may sit idle between its statements: a
# replica frozen mid-claim (SIGSTOP, a VM paused, a swap storm) would otherwise hold the lock,
# and every replica's claims with it, until it thawed. PostgreSQL ends such a session after
# this long, which frees the lock; the frozen replica finds its connection gone and claims
# again. A SIGKILLed replica needs none of this: its connection closes.
IDLE_CLAIM_LIMIT_MS = 10_000


class _Read:
    """The candidates statement's rows, by kind (claims.pick's arguments, and the shown flow
    runs of each workspace for its Walk, with the sort key of the last one read)."""

    def __init__(self, rows: list[TupleRow]) -> None:
        self.queued: list[Candidate] = []
        self.woken: list[Candidate] = []
        self.held: list[tuple[Group, int]] = []
        self.served: dict[str, Any] = {}
        self.entries: dict[str, list[Entry]] = {}
        self.last: dict[str, dict[str, Any]] = {}
        for kind, run_id, workspace, agent, key, number, at, flow_limit, flow_max, leased in rows:
            if kind == "held":
                self.held.append(((workspace, agent, key), number))
            elif kind == "served":
                self.served[workspace] = at
            elif kind == "entry":
                entry = Entry(run_id, (workspace, agent, key), leased, flow_limit, flow_max)
                self.entries.setdefault(workspace, []).append(entry)
                self.last[workspace] = {"id": run_id, "priority": number, "at": at}
            else:
                c = Candidate(
                    run_id, workspace, agent, number, at, key, flow_limit, flow_max, kind == "woken"
                )
                (self.woken if c.woken else self.queued).append(c)


def _groups(groups: Sequence[Group]) -> dict[str, list[str]]:
    return {
        "gw": [g[0] for g in groups],
        "ga": [g[1] for g in groups],
        "gk": [g[2] for g in groups],
    }


def _literal_statuses(statuses: tuple[RunStatus, ...]) -> str:
    assert all(s in ACTIVE for s in statuses), statuses  # literals, never caller text
    return ", ".join(f"'{s}'" for s in statuses)


class Leases(PostgresConnection):
    _UPSERT_LEASE = (
        "INSERT INTO run_locks (run_id, worker_id, expires_at, epoch, workspace, agent_name,"
        " flow_key) SELECT id, %(worker)s, now() + make_interval(secs => %(ttl)s), 1,"
        " workspace, agent_name, flow_key FROM {source}"
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
        self,
        worker_id: str,
        ttl: float,
        limit: int,
        statuses: tuple[RunStatus, ...],
        *,
        skip: Container[str] = frozenset(),
    ) -> list[Lease]:
        if statuses == ("queued",) and not (await self._fetchall(_CLAIMABLE))[0][0]:
            return []
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
        args = {"worker": worker_id, "ttl": ttl, "limit": limit}
        async with self._connection() as conn, conn.transaction():
            await conn.execute(_LOCK, (_CLAIM_LOCK, str(IDLE_CLAIM_LIMIT_MS)))
            cur = await conn.execute(
                _EXPIRED.format(statuses=_literal_statuses(statuses)).encode(), args
            )
            found = [
                Orphan(r[0], None if r[1] is None else Lease(r[0], worker_id, r[1]), r[2], r[3])
                for r in await cur.fetchall()
            ]
            if "queued" not in statuses or len(found) >= limit:
                return found
            want = args["limit"] = limit - len(found)
            batch = args["batch"] = want + BATCH
            cur = await conn.execute(_CANDIDATES.encode(), args)
            read = _Read(await cur.fetchall())
            walks: list[Walk] = []
            for workspace, entries in read.entries.items():
                walk = Walk(Slots(read.held), want)
                walks.append(walk)
                walk.feed(entries)
                while not walk.done and len(entries) == batch:  # read on
                    more = {"ws": workspace, "batch": batch, **read.last[workspace]}
                    cur = await conn.execute(_MORE.encode(), more)
                    rows = await cur.fetchall()
                    entries = [Entry(r[0], (r[1], r[2], r[3]), r[6], r[4], r[5]) for r in rows]
                    if rows:
                        read.last[workspace] = {
                            "id": rows[-1][0],
                            "priority": rows[-1][7],
                            "at": rows[-1][8],
                        }
                    walk.feed(entries)
            opened = [group_n for w in walks for group_n in w.open]
            if opened:
                heads = {**_groups([g for g, _ in opened]), "n": [n for _, n in opened]}
                cur = await conn.execute(_HEADS.encode(), heads)
                read.queued += [Candidate(*r) for r in await cur.fetchall()]
            queued = [c for c in read.queued if c.id not in skip]
            chosen = pick(queued, read.woken, read.held, read.served, want)
            hide, show = marks(walks, chosen)
            if not chosen and not hide and not show:
                return found
            ids = [c.id for c in chosen]
            marked = {**args, "ids": ids, "hide": hide, **_groups(show)}
            cur = await conn.execute((_TAKE_MARKING if hide or show else _TAKE).encode(), marked)
            epochs = dict(await cur.fetchall())
        return found + [
            Orphan(i, Lease(i, worker_id, epochs[i]), None, None) for i in ids if i in epochs
        ]

    async def claim_run(self, run_id: str, worker_id: str, ttl: float) -> Lease | None:
        async with self._connection() as conn, conn.transaction():
            await conn.execute(_LOCK, (_CLAIM_LOCK, str(IDLE_CLAIM_LIMIT_MS)))
            cur = await conn.execute(_ONE.encode(), {"run": run_id})
            run = own_candidate(await cur.fetchone())
            if run is None:
                return None
            if run.flow_key is not None:
                cur = await conn.execute(_ON_ITS_OWN.encode(), own_counts_args(run))
                counts = await cur.fetchone()
                assert counts is not None
                group_held, agent_held, ahead = counts
                if not admits(run, ahead, group_held, agent_held):
                    return None
            hide, show = marks([], [run])
            args = {"ids": [run_id], "worker": worker_id, "ttl": ttl, "hide": hide}
            take = _TAKE_MARKING if hide or show else _TAKE
            cur = await conn.execute(take.encode(), {**args, **_groups(show)})
            taken = await cur.fetchone()
        return None if taken is None else Lease(run_id, worker_id, taken[1])

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
