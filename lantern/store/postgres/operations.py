"""Operating runs across a workspace: the approvals nobody has decided yet, and retries."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from psycopg.types.json import Jsonb

from lantern.store.codec import dumps
from lantern.store.postgres.connection import PostgresConnection
from lantern.store.postgres.journal import _blob_rows, _event_rows
from lantern.store.records import NewEvent, PendingApproval, Run, RunGauges

# A step_waiting of kind approval whose step has not been resumed since and has no decision.
_PENDING = """
SELECT e.run_id, e.step_id, r.agent_name, e.data->>'prompt', e.at
FROM runs r JOIN journal_events e ON e.run_id = r.id
WHERE r.workspace = %s AND r.status IN ('running', 'waiting')
  AND e.kind = 'step_waiting' AND e.data->>'kind' = 'approval'
  AND NOT EXISTS (SELECT 1 FROM journal_events x WHERE x.run_id = e.run_id
                  AND x.step_id = e.step_id AND x.seq > e.seq AND x.kind = 'step_resumed')
  AND NOT EXISTS (SELECT 1 FROM approvals a WHERE a.run_id = e.run_id AND a.node_id = e.step_id)
ORDER BY e.at, e.run_id LIMIT %s
"""

_RETRY = """
WITH created AS (
    INSERT INTO runs (id, workspace, agent_name, agent_version, status, input, created_at,
                      updated_at, wake_at, priority, flow_key, flow_limit, flow_max)
    VALUES (%(id)s, %(workspace)s, %(agent)s, %(version)s, 'waiting', %(input)s, %(created)s,
            %(created)s, now(), %(priority)s, %(flow_key)s, %(flow_limit)s, %(flow_max)s)
    RETURNING id
), stored_blobs AS (
    INSERT INTO blobs (digest, body)
    SELECT digest, decode(body, 'base64')
    FROM json_to_recordset(%(blobs)s::json) AS x(digest text, body text) ORDER BY digest
    -- An upsert, not DO NOTHING: it locks a blob a deletion may be removing (see retention.py)
    ON CONFLICT (digest) DO UPDATE SET digest = excluded.digest
)
INSERT INTO journal_events (run_id, seq, kind, at, data, step_id, node_id, attempt, blob_digest,
                            hash)
SELECT c.id, b.seq, b.kind, b.at, b.data, b.step_id, b.node_id, b.attempt, b.blob_digest, b.hash
FROM created c, json_to_recordset(%(events)s::json) AS b(
    run_id text, epoch bigint, seq bigint, kind text, at timestamptz, data jsonb,
    step_id text, node_id text, attempt int, blob_digest text, hash text)
"""


class Operations(PostgresConnection):
    async def pending_approvals(self, workspace: str, limit: int = 500) -> list[PendingApproval]:
        rows = await self._fetchall(_PENDING, (workspace, limit))
        return [PendingApproval(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    async def create_retry(self, run: Run, events: Sequence[NewEvent]) -> Run:
        params = {
            "id": run.id,
            "workspace": run.workspace,
            "agent": run.agent_name,
            "version": run.agent_version,
            "input": Jsonb(run.input),
            "created": run.created_at,
            "priority": run.priority,
            "flow_key": None if run.flow is None else run.flow.key,
            "flow_limit": None if run.flow is None else run.flow.limit,
            "flow_max": None if run.flow is None else run.flow.max_runs,
            "events": dumps(_event_rows(events)),
            "blobs": _blob_rows(events),
        }
        async with self._pool.connection() as conn:
            await conn.execute(_RETRY.encode(), params)
        return replace(run, status="waiting")

    async def gauges(self) -> RunGauges:
        rows = await self._fetchall(
            "SELECT workspace, status, COUNT(*) FROM runs"
            " WHERE status IN ('queued', 'running', 'waiting') GROUP BY workspace, status"
        )
        held = await self._fetchone("SELECT COUNT(*) FROM run_locks WHERE expires_at > now()")
        oldest = await self._fetchone("SELECT MIN(created_at) FROM runs WHERE status = 'queued'")
        return RunGauges(
            {(r[0], r[1]): int(r[2]) for r in rows},
            int(held[0]) if held else 0,
            oldest[0] if oldest else None,
        )
