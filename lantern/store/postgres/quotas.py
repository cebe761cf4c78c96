"""Counts behind the per-workspace limits (docs/security.md)."""

from __future__ import annotations

from collections.abc import Sequence

from lantern.store.postgres.connection import PostgresConnection

# Whether ``at_most`` or more runs of the workspace other than ``id`` are queued: read in the
# transaction that stores ``id`` queued (``Journal.start_new_run``), bounded as
# ``queued_count`` is.
QUEUE_FULL = (
    "SELECT COUNT(*) >= %(at_most)s FROM (SELECT 1 FROM runs WHERE workspace = %(workspace)s"
    " AND status = 'queued' AND id <> %(id)s LIMIT %(at_most)s) q"
)


class Quotas(PostgresConnection):
    async def queued_count(self, workspace: str, at_most: int) -> int:
        row = await self._fetchone(
            "SELECT COUNT(*) FROM (SELECT 1 FROM runs WHERE workspace = %s AND status = 'queued'"
            " LIMIT %s) q",
            (workspace, at_most),
        )
        assert row is not None
        return int(row[0])

    async def runs_in_workspace(self, workspace: str, run_ids: Sequence[str]) -> set[str]:
        rows = await self._fetchall(
            "SELECT id FROM runs WHERE workspace = %s AND id = ANY(%s)", (workspace, list(run_ids))
        )
        return {r[0] for r in rows}
