"""Large outputs read back, and finished runs deleted whole (lantern.store.retention).

SQLite has one writer: a deletion transaction holds it while it runs, so the retention pass
deletes a few runs per transaction and leaves the writer to the runs in flight twice as long
as each transaction took (``retention_share``, docs/retention.md).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence

from lantern.store.retention import Deleted, StorageGauges
from lantern.store.sqlite.connection import SQLiteConnection
from lantern.store.sqlite.rows import _time

FINISHED = "('succeeded', 'failed', 'cancelled')"
# Every table whose rows belong to one run, deleted before the run's own row (foreign keys).
RUN_TABLES = (
    "journal_events",
    "side_effect_receipts",
    "approvals",
    "signals",
    "receipts",
    "runtime_vms",
    "run_locks",
)

# A run with an unfinished sub-agent run waits for it: unlinking the child would lock its row.
_LIVE_CHILD = (
    "EXISTS (SELECT 1 FROM runs c WHERE c.parent_run_id = r.id"
    " AND c.status IN ('queued', 'running', 'waiting'))"
)

_EXPIRED = f"""
SELECT r.id FROM runs r LEFT JOIN workspace_settings w ON w.workspace = r.workspace
WHERE r.status IN {FINISHED} AND r.id < ?
  AND r.updated_at < ? - COALESCE(w.retention_s, ?)
  AND NOT {_LIVE_CHILD}
ORDER BY r.id LIMIT ?
"""

_UNREFERENCED = (
    "FROM blobs WHERE digest IN ({}) AND NOT EXISTS"
    " (SELECT 1 FROM journal_events e WHERE e.blob_digest = blobs.digest)"
)


def id_bound(newest_finish: float) -> str:
    """Every run finished before ``newest_finish`` was created before it, so its id (whose
    prefix is its creation time in ms) sorts below this one: the scan stops there."""
    return f"run_{int(newest_finish * 1000):012x}"


class Retention(SQLiteConnection):
    # Every append of a run in flight queues behind a deletion on the one writer: a pass
    # takes at most a third of its time (bench/retention.py at 20,000 runs: per-step p99
    # ratio 1.43 with a third, 1.54 with half).
    retention_share = 1 / 3

    async def blob(self, run_id: str, digest: str) -> bytes | None:
        sql = (
            "SELECT b.body FROM journal_events e JOIN blobs b ON b.digest = e.blob_digest"
            " WHERE e.blob_digest = ? AND e.run_id = ? LIMIT 1"
        )
        row = await self._read(lambda c: c.execute(sql, (digest, run_id)).fetchone())
        return None if row is None else bytes(row[0])

    async def workspace_retention(self, workspace: str) -> float | None:
        sql = "SELECT retention_s FROM workspace_settings WHERE workspace = ?"
        row = await self._read(lambda c: c.execute(sql, (workspace,)).fetchone())
        return None if row is None or row[0] is None else float(row[0])

    async def set_workspace_retention(self, workspace: str, seconds: float | None) -> None:
        sql = (
            "INSERT INTO workspace_settings (workspace, retention_s, updated_at) VALUES (?, ?, ?)"
            " ON CONFLICT (workspace) DO UPDATE SET retention_s = excluded.retention_s,"
            " updated_at = excluded.updated_at"
        )
        args = (workspace, seconds, time.time())
        await self._write(lambda c: c.execute(sql, args))

    async def expired_runs(self, default_s: float | None, limit: int) -> list[str]:
        def read(conn: sqlite3.Connection) -> list[str]:
            shortest = conn.execute("SELECT MIN(retention_s) FROM workspace_settings").fetchone()
            found = [s for s in (shortest[0], default_s) if s is not None]
            if not found:
                return []
            now = time.time()
            args = (id_bound(now - min(found)), now, default_s, limit)
            return [r[0] for r in conn.execute(_EXPIRED, args)]

        return await self._read(read)

    async def delete_runs(self, run_ids: Sequence[str]) -> Deleted:
        if not run_ids:
            return Deleted(())
        return await self._write(lambda c: _delete(c, list(run_ids)))

    async def storage_gauges(self) -> StorageGauges:
        def read(conn: sqlite3.Connection) -> StorageGauges:
            # The first finished run by id (by creation) stands for the oldest one kept: the
            # pass deletes in that order, and the index answers at once however many there are.
            row = conn.execute(
                f"SELECT updated_at FROM runs WHERE status IN {FINISHED} ORDER BY id LIMIT 1"
            ).fetchone()
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            size = conn.execute("PRAGMA page_size").fetchone()[0]
            return StorageGauges(None if row is None else _time(row[0]), int(pages * size))

        return await self._read(read)


def _delete(conn: sqlite3.Connection, run_ids: list[str]) -> Deleted:
    marks = ", ".join("?" * len(run_ids))
    ids = [
        r[0]
        for r in conn.execute(
            f"SELECT id FROM runs r WHERE id IN ({marks}) AND status IN {FINISHED}"
            f" AND NOT {_LIVE_CHILD}",
            run_ids,
        )
    ]
    if not ids:
        return Deleted(())
    marks = ", ".join("?" * len(ids))
    size = conn.execute(
        "SELECT COALESCE(SUM(length(CAST(data AS BLOB))), 0) FROM journal_events"
        f" WHERE run_id IN ({marks})",
        ids,
    ).fetchone()[0]
    digests = [
        r[0]
        for r in conn.execute(
            "SELECT DISTINCT blob_digest FROM journal_events"
            f" WHERE run_id IN ({marks}) AND blob_digest IS NOT NULL",
            ids,
        )
    ]
    rows = 0
    for table in RUN_TABLES:
        rows += conn.execute(f"DELETE FROM {table} WHERE run_id IN ({marks})", ids).rowcount
    conn.execute(f"UPDATE runs SET parent_run_id = NULL WHERE parent_run_id IN ({marks})", ids)
    rows += conn.execute(f"DELETE FROM runs WHERE id IN ({marks})", ids).rowcount
    blobs = blob_bytes = 0
    if digests:
        # One writer: no append can slip a new reference in between this check and the delete.
        unreferenced = _UNREFERENCED.format(", ".join("?" * len(digests)))
        blob_bytes = conn.execute(
            f"SELECT COALESCE(SUM(length(body)), 0) {unreferenced}", digests
        ).fetchone()[0]
        blobs = conn.execute(f"DELETE {unreferenced}", digests).rowcount
    return Deleted(tuple(ids), rows + blobs, int(size) + int(blob_bytes), blobs)
