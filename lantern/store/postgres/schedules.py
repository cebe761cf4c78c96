"""Schedules (lantern.store.schedules) on PostgreSQL."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb

from lantern.store.postgres.connection import PostgresConnection
from lantern.store.postgres.rows import _RUN_COLUMNS, _run
from lantern.store.records import Run
from lantern.store.schedules import (
    Advance,
    Schedule,
    schedule_runs_query,
    skips_from_json,
    skips_to_json,
)

_COLUMNS = (
    "workspace, name, definition, paused, next_fire_at, created_at, updated_at, last_fire_at,"
    " last_run_id, buffered_fire_at, recent_skips"
)


def _schedule(row: TupleRow) -> Schedule:
    return Schedule(
        workspace=row[0],
        name=row[1],
        definition=row[2],
        paused=row[3],
        next_fire_at=row[4],
        created_at=row[5],
        updated_at=row[6],
        last_fire_at=row[7],
        last_run_id=row[8],
        buffered_fire_at=row[9],
        recent_skips=skips_from_json(row[10]),
    )


class Schedules(PostgresConnection):
    async def put_schedule(
        self,
        workspace: str,
        name: str,
        definition: dict[str, Any],
        paused: bool,
        next_fire_at: datetime,
    ) -> Schedule:
        row = await self._fetchone(
            "INSERT INTO schedules (workspace, name, definition, paused, next_fire_at)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (workspace, name) DO UPDATE SET"
            " definition = excluded.definition, paused = excluded.paused,"
            " next_fire_at = excluded.next_fire_at, buffered_fire_at = NULL, updated_at = now()"
            f" RETURNING {_COLUMNS}",
            (workspace, name, Jsonb(definition), paused, next_fire_at),
        )
        assert row is not None
        return _schedule(row)

    async def get_schedule(self, workspace: str, name: str) -> Schedule | None:
        row = await self._fetchone(
            f"SELECT {_COLUMNS} FROM schedules WHERE workspace = %s AND name = %s",
            (workspace, name),
        )
        return None if row is None else _schedule(row)

    async def list_schedules(self, workspace: str) -> list[Schedule]:
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM schedules WHERE workspace = %s ORDER BY name", (workspace,)
        )
        return [_schedule(r) for r in rows]

    async def delete_schedule(self, workspace: str, name: str) -> bool:
        rows = await self._fetchall(
            "DELETE FROM schedules WHERE workspace = %s AND name = %s RETURNING name",
            (workspace, name),
        )
        return bool(rows)

    async def due_schedules(self, now: datetime, limit: int) -> list[Schedule]:
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM schedules WHERE NOT paused"
            " AND (next_fire_at <= %s OR buffered_fire_at IS NOT NULL)"
            " ORDER BY next_fire_at LIMIT %s",
            (now, limit),
        )
        return [_schedule(r) for r in rows]

    async def next_fire(self) -> datetime | None:
        row = await self._fetchone("SELECT min(next_fire_at) FROM schedules WHERE NOT paused")
        return None if row is None else row[0]

    async def advance_schedule(self, schedule: Schedule, advance: Advance) -> bool:
        a = advance
        rows = await self._fetchall(
            "UPDATE schedules SET next_fire_at = %s, last_fire_at = %s, last_run_id = %s,"
            " buffered_fire_at = %s, recent_skips = %s"
            " WHERE workspace = %s AND name = %s AND next_fire_at = %s"
            " AND buffered_fire_at IS NOT DISTINCT FROM %s RETURNING name",
            (
                a.next_fire_at,
                a.last_fire_at,
                a.last_run_id,
                a.buffered_fire_at,
                Jsonb(skips_to_json(a.recent_skips)),
                schedule.workspace,
                schedule.name,
                schedule.next_fire_at,
                schedule.buffered_fire_at,
            ),
        )
        return bool(rows)

    async def record_fire(
        self, workspace: str, name: str, fire_time: datetime, run_id: str
    ) -> None:
        await self._fetchall(
            "UPDATE schedules SET last_fire_at = %s, last_run_id = %s"
            " WHERE workspace = %s AND name = %s"
            " AND (last_fire_at IS NULL OR last_fire_at <= %s) RETURNING name",
            (fire_time, run_id, workspace, name, fire_time),
        )

    async def schedule_runs(
        self,
        workspace: str,
        name: str,
        *,
        status: str | None = None,
        agent_name: str | None = None,
        limit: int = 50,
        before: str | None = None,
    ) -> list[Run]:
        sql, args = schedule_runs_query(
            _RUN_COLUMNS, "%s", workspace, name, status, agent_name, limit, before
        )
        rows = await self._fetchall(sql, tuple(args))
        return [_run(r) for r in rows]

    async def run_key(self, run_id: str) -> str | None:
        row = await self._fetchone("SELECT idempotency_key FROM runs WHERE id = %s", (run_id,))
        return None if row is None else row[0]
