"""Operating runs across a workspace: the approvals nobody has decided yet, and retries."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from dataclasses import replace

from lantern.store.codec import dumps, loads_or_none
from lantern.store.records import NewEvent, PendingApproval, Run, RunGauges
from lantern.store.sqlite.connection import SQLiteConnection
from lantern.store.sqlite.rows import _EVENT_COLUMNS, _time

# A step_waiting of kind approval whose step has not been resumed since and has no decision.
_PENDING = """
SELECT e.run_id, e.step_id, r.agent_name, e.data, e.at
FROM runs r JOIN journal_events e ON e.run_id = r.id
WHERE r.workspace = ? AND r.status IN ('running', 'waiting')
  AND e.kind = 'step_waiting' AND json_extract(e.data, '$.kind') = 'approval'
  AND NOT EXISTS (SELECT 1 FROM journal_events x WHERE x.run_id = e.run_id
                  AND x.step_id = e.step_id AND x.seq > e.seq AND x.kind = 'step_resumed')
  AND NOT EXISTS (SELECT 1 FROM approvals a WHERE a.run_id = e.run_id AND a.node_id = e.step_id)
ORDER BY e.at, e.run_id LIMIT ?
"""


class Operations(SQLiteConnection):
    async def pending_approvals(self, workspace: str, limit: int = 500) -> list[PendingApproval]:
        rows = await self._read(lambda c: c.execute(_PENDING, (workspace, limit)).fetchall())
        found = []
        for run_id, step_id, agent, data, at in rows:
            prompt = (loads_or_none(data) or {}).get("prompt")
            found.append(PendingApproval(run_id, step_id, agent, prompt, _time(at)))
        return found

    async def create_retry(self, run: Run, events: Sequence[NewEvent]) -> Run:
        now = time.time()

        def tx(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO runs (id, workspace, agent_name, agent_version, status, input,"
                " created_at, updated_at, wake_at, priority, flow_key, flow_limit, flow_max)"
                " VALUES (?, ?, ?, ?, 'waiting', ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run.id,
                    run.workspace,
                    run.agent_name,
                    run.agent_version,
                    dumps(run.input),
                    run.created_at.timestamp(),
                    run.created_at.timestamp(),
                    now,
                    run.priority,
                    None if run.flow is None else run.flow.key,
                    None if run.flow is None else run.flow.limit,
                    None if run.flow is None else run.flow.max_runs,
                ),
            )
            blobs = [(e.blob.digest, e.blob.body) for e in events if e.blob is not None]
            conn.executemany("INSERT OR IGNORE INTO blobs (digest, body) VALUES (?, ?)", blobs)
            conn.executemany(
                f"INSERT INTO journal_events ({_EVENT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        run.id,
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
                    for e in events
                ],
            )

        await self._write(tx)
        return replace(run, status="waiting")

    async def gauges(self) -> RunGauges:
        def read(conn: sqlite3.Connection) -> RunGauges:
            rows = conn.execute(
                "SELECT workspace, status, COUNT(*) FROM runs"
                " WHERE status IN ('queued', 'running', 'waiting') GROUP BY workspace, status"
            ).fetchall()
            held = conn.execute(
                "SELECT COUNT(*) FROM run_locks WHERE expires_at > ?", (time.time(),)
            ).fetchone()[0]
            oldest = conn.execute(
                "SELECT MIN(created_at) FROM runs WHERE status = 'queued'"
            ).fetchone()[0]
            return RunGauges(
                {(r[0], r[1]): int(r[2]) for r in rows},
                int(held),
                None if oldest is None else _time(oldest),
            )

        return await self._read(read)
