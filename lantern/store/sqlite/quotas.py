"""Counts behind the per-workspace limits (docs/security.md)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from lantern.store.sqlite.connection import SQLiteConnection
from lantern.store.sqlite.runs import in_lists, marks

# Whether ``:at_most`` or more runs of the workspace other than ``:id`` are queued: read in the
# transaction that stores ``:id`` queued (``Journal.start_new_run``), bounded as
# ``queued_count`` is.
QUEUE_FULL = (
    "SELECT COUNT(*) >= :at_most FROM (SELECT 1 FROM runs WHERE workspace = :workspace"
    " AND status = 'queued' AND id <> :id LIMIT :at_most)"
)


def queue_is_full(conn: sqlite3.Connection, workspace: str, run_id: str, at_most: int) -> bool:
    args = {"workspace": workspace, "id": run_id, "at_most": at_most}
    return bool(conn.execute(QUEUE_FULL, args).fetchone()[0])


class Quotas(SQLiteConnection):
    async def queued_count(self, workspace: str, at_most: int) -> int:
        sql = (
            "SELECT COUNT(*) FROM (SELECT 1 FROM runs WHERE workspace = ? AND status = 'queued'"
            " LIMIT ?)"
        )
        row = await self._lookup(lambda c: c.execute(sql, (workspace, at_most)).fetchone())
        return int(row[0])

    async def runs_in_workspace(self, workspace: str, run_ids: Sequence[str]) -> set[str]:
        found: set[str] = set()
        for ids in in_lists(run_ids):
            sql = f"SELECT id FROM runs WHERE workspace = ? AND id IN ({marks(ids)})"
            rows = await self._read(_select(sql, (workspace, *ids)))
            found.update(r[0] for r in rows)
        return found


def _select(sql: str, args: tuple[str, ...]) -> Callable[[sqlite3.Connection], list[Any]]:
    return lambda c: c.execute(sql, args).fetchall()
