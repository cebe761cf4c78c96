"""Large outputs read back, and finished runs deleted whole (lantern.store.retention).

A deletion takes row locks on finished runs only. Blobs are the one thing a run in flight may
share with a deleted run: an append that stores a blob upserts its row (so it locks it), and a
deletion locks the candidate blobs first and looks for references after, in a statement of its
own (a fresh snapshot under READ COMMITTED). Either the append commits first and its event is
seen, or the blob is gone first and the append's upsert writes it again.
"""

from __future__ import annotations

from collections.abc import Sequence

from lantern.store.postgres.connection import PostgresConnection
from lantern.store.retention import Deleted, StorageGauges

FINISHED = "('succeeded', 'failed', 'cancelled')"

# A run with an unfinished sub-agent run waits for it: unlinking the child would lock its row.
_LIVE_CHILD = (
    "EXISTS (SELECT 1 FROM runs c WHERE c.parent_run_id = r.id"
    " AND c.status IN ('queued', 'running', 'waiting'))"
)

_EXPIRED = f"""
SELECT r.id FROM runs r LEFT JOIN workspace_settings w ON w.workspace = r.workspace
WHERE r.status IN {FINISHED} AND r.id < %(bound)s
  AND r.updated_at < now() - make_interval(secs => COALESCE(w.retention_s, %(default)s))
  AND NOT {_LIVE_CHILD}
ORDER BY r.id LIMIT %(limit)s
"""

# Everything that belongs to the runs but their own rows, in one statement.
_DELETE_OWNED = """
WITH events AS (
    DELETE FROM journal_events WHERE run_id = ANY(%(ids)s)
    RETURNING blob_digest, pg_column_size(data) AS size
), deliveries AS (
    DELETE FROM side_effect_receipts WHERE run_id = ANY(%(ids)s) RETURNING 1
), decisions AS (
    DELETE FROM approvals WHERE run_id = ANY(%(ids)s) RETURNING 1
), signalled AS (
    DELETE FROM signals WHERE run_id = ANY(%(ids)s) RETURNING 1
), signed AS (
    DELETE FROM receipts WHERE run_id = ANY(%(ids)s) RETURNING 1
), vms AS (
    DELETE FROM runtime_vms WHERE run_id = ANY(%(ids)s) RETURNING 1
), locks AS (
    DELETE FROM run_locks WHERE run_id = ANY(%(ids)s) RETURNING 1
), unlinked AS (
    UPDATE runs SET parent_run_id = NULL WHERE parent_run_id = ANY(%(ids)s)
)
SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM deliveries)
       + (SELECT count(*) FROM decisions) + (SELECT count(*) FROM signalled)
       + (SELECT count(*) FROM signed)
       + (SELECT count(*) FROM vms) + (SELECT count(*) FROM locks),
       (SELECT COALESCE(sum(size), 0) FROM events),
       ARRAY(SELECT DISTINCT blob_digest FROM events WHERE blob_digest IS NOT NULL
             ORDER BY blob_digest)
"""


def id_bound(seconds_ago: float) -> str:
    """SQL for the id every run finished ``seconds_ago`` or earlier sorts below: it was
    created before then, and an id's prefix is its creation time in ms."""
    return (
        "'run_' || lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint"
        f" - ({float(seconds_ago)} * 1000)::bigint), 12, '0')"
    )


class Retention(PostgresConnection):
    # Deletions touch only finished runs' rows, and writers do not wait on each other.
    retention_share = 1.0

    async def blob(self, run_id: str, digest: str) -> bytes | None:
        row = await self._fetchone(
            "SELECT b.body FROM journal_events e JOIN blobs b ON b.digest = e.blob_digest"
            " WHERE e.blob_digest = %s AND e.run_id = %s LIMIT 1",
            (digest, run_id),
        )
        return None if row is None else bytes(row[0])

    async def workspace_retention(self, workspace: str) -> float | None:
        row = await self._fetchone(
            "SELECT retention_s FROM workspace_settings WHERE workspace = %s", (workspace,)
        )
        return None if row is None or row[0] is None else float(row[0])

    async def set_workspace_retention(self, workspace: str, seconds: float | None) -> None:
        await self._fetchall(
            "INSERT INTO workspace_settings (workspace, retention_s) VALUES (%s, %s)"
            " ON CONFLICT (workspace) DO UPDATE SET retention_s = excluded.retention_s,"
            " updated_at = now() RETURNING 1",
            (workspace, seconds),
            again=True,
        )

    async def expired_runs(self, default_s: float | None, limit: int) -> list[str]:
        row = await self._fetchone("SELECT MIN(retention_s) FROM workspace_settings")
        found = [s for s in (row[0] if row else None, default_s) if s is not None]
        if not found:
            return []
        sql = _EXPIRED.replace("%(bound)s", id_bound(min(found)))
        rows = await self._fetchall(sql, {"default": default_s, "limit": limit})
        return [r[0] for r in rows]

    async def delete_runs(self, run_ids: Sequence[str]) -> Deleted:
        if not run_ids:
            return Deleted(())
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute(
                f"SELECT id FROM runs r WHERE id = ANY(%s) AND status IN {FINISHED}"
                f" AND NOT {_LIVE_CHILD} ORDER BY id FOR UPDATE OF r",
                (list(run_ids),),
            )
            ids = [r[0] for r in await cur.fetchall()]
            if not ids:
                return Deleted(())
            cur = await conn.execute(_DELETE_OWNED.encode(), {"ids": ids})
            owned = await cur.fetchone()
            assert owned is not None
            rows, size, digests = int(owned[0]), int(owned[1]), list(owned[2])
            cur = await conn.execute("DELETE FROM runs WHERE id = ANY(%s)", (ids,))
            rows += cur.rowcount
            blobs = blob_bytes = 0
            if digests:
                # Lock first, look after: an append storing one of them is waited for, and
                # the look below (a new snapshot) then sees its event.
                await conn.execute(
                    "SELECT 1 FROM blobs WHERE digest = ANY(%s) ORDER BY digest FOR UPDATE",
                    (digests,),
                )
                cur = await conn.execute(
                    "DELETE FROM blobs b WHERE digest = ANY(%s) AND NOT EXISTS"
                    " (SELECT 1 FROM journal_events e WHERE e.blob_digest = b.digest)"
                    " RETURNING octet_length(body)",
                    (digests,),
                )
                sizes = [int(r[0]) for r in await cur.fetchall()]
                blobs, blob_bytes = len(sizes), sum(sizes)
        return Deleted(tuple(ids), rows + blobs, size + blob_bytes, blobs)

    async def storage_gauges(self) -> StorageGauges:
        # The first finished run by id (by creation) stands for the oldest one kept: the pass
        # deletes in that order, and the index answers at once however many there are.
        row = await self._fetchone(
            f"SELECT updated_at FROM runs WHERE status IN {FINISHED} ORDER BY id LIMIT 1"
        )
        size = await self._fetchone("SELECT pg_database_size(current_database())")
        return StorageGauges(row[0] if row else None, int(size[0]) if size else None)
