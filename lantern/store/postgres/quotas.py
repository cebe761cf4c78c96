"""Counts behind the per-workspace limits (docs/security.md)."""

from __future__ import annotations

from collections.abc import Sequence

from lantern.store.postgres.connection import PostgresConnection


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
