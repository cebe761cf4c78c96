"""What operators read across a workspace's runs: the approvals nobody has decided yet."""

from __future__ import annotations

from lantern.store.postgres.connection import PostgresConnection
from lantern.store.records import PendingApproval

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


class Operations(PostgresConnection):
    async def pending_approvals(self, workspace: str, limit: int = 500) -> list[PendingApproval]:
        rows = await self._fetchall(_PENDING, (workspace, limit))
        return [PendingApproval(r[0], r[1], r[2], r[3], r[4]) for r in rows]
