"""What operators read across a workspace's runs: the approvals nobody has decided yet."""

from __future__ import annotations

from lantern.store.codec import loads_or_none
from lantern.store.records import PendingApproval
from lantern.store.sqlite.connection import SQLiteConnection
from lantern.store.sqlite.rows import _time

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
