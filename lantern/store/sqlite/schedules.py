"""Schedules (lantern.store.schedules) on SQLite: times as epoch seconds, JSON as text."""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import datetime
from typing import Any

from lantern.store.codec import dumps
from lantern.store.records import Run
from lantern.store.schedules import (
    Advance,
    Schedule,
    schedule_runs_query,
    skips_from_json,
    skips_to_json,
)
from lantern.store.sqlite.connection import SQLiteConnection
from lantern.store.sqlite.rows import _RUN_COLUMNS, _run, _time

_COLUMNS = (
    "workspace, name, definition, paused, next_fire_at, created_at, updated_at, last_fire_at,"
    " last_run_id, buffered_fire_at, recent_skips"
)


def _maybe(value: float | None) -> datetime | None:
    return None if value is None else _time(value)


def _epoch(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _schedule(row: sqlite3.Row) -> Schedule:
    return Schedule(
        workspace=row[0],
        name=row[1],
        definition=json.loads(row[2]),
        paused=bool(row[3]),
        next_fire_at=_time(row[4]),
        created_at=_time(row[5]),
        updated_at=_time(row[6]),
        last_fire_at=_maybe(row[7]),
        last_run_id=row[8],
        buffered_fire_at=_maybe(row[9]),
        recent_skips=skips_from_json(json.loads(row[10])),
    )


class Schedules(SQLiteConnection):
    async def put_schedule(
        self,
        workspace: str,
        name: str,
        definition: dict[str, Any],
        paused: bool,
        next_fire_at: datetime,
    ) -> Schedule:
        def tx(conn: sqlite3.Connection) -> Schedule:
            now = time.time()
            conn.execute(
                "INSERT INTO schedules (workspace, name, definition, paused, next_fire_at,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (workspace, name) DO UPDATE SET definition = excluded.definition,"
                " paused = excluded.paused, next_fire_at = excluded.next_fire_at,"
                " buffered_fire_at = NULL, updated_at = excluded.updated_at",
                (workspace, name, dumps(definition), paused, next_fire_at.timestamp(), now, now),
            )
            sql = f"SELECT {_COLUMNS} FROM schedules WHERE workspace = ? AND name = ?"
            return _schedule(conn.execute(sql, (workspace, name)).fetchone())

        return await self._write(tx)

    async def get_schedule(self, workspace: str, name: str) -> Schedule | None:
        sql = f"SELECT {_COLUMNS} FROM schedules WHERE workspace = ? AND name = ?"
        row = await self._read(lambda c: c.execute(sql, (workspace, name)).fetchone())
        return None if row is None else _schedule(row)

    async def list_schedules(self, workspace: str) -> list[Schedule]:
        sql = f"SELECT {_COLUMNS} FROM schedules WHERE workspace = ? ORDER BY name"
        rows = await self._read(lambda c: c.execute(sql, (workspace,)).fetchall())
        return [_schedule(r) for r in rows]

    async def delete_schedule(self, workspace: str, name: str) -> bool:
        sql = "DELETE FROM schedules WHERE workspace = ? AND name = ?"
        return bool(await self._write(lambda c: c.execute(sql, (workspace, name)).rowcount))

    async def due_schedules(self, now: datetime, limit: int) -> list[Schedule]:
        sql = (
            f"SELECT {_COLUMNS} FROM schedules WHERE NOT paused"
            " AND (next_fire_at <= ? OR buffered_fire_at IS NOT NULL)"
            " ORDER BY next_fire_at LIMIT ?"
        )
        rows = await self._read(lambda c: c.execute(sql, (now.timestamp(), limit)).fetchall())
        return [_schedule(r) for r in rows]

    async def next_fire(self) -> datetime | None:
        sql = "SELECT min(next_fire_at) FROM schedules WHERE NOT paused"
        row = await self._read(lambda c: c.execute(sql).fetchone())
        return None if row is None else _maybe(row[0])

    async def advance_schedule(self, schedule: Schedule, advance: Advance) -> bool:
        a, s = advance, schedule
        sql = (
            "UPDATE schedules SET next_fire_at = ?, last_fire_at = ?, last_run_id = ?,"
            " buffered_fire_at = ?, recent_skips = ?"
            " WHERE workspace = ? AND name = ? AND next_fire_at = ? AND buffered_fire_at IS ?"
        )
        args = (
            a.next_fire_at.timestamp(),
            _epoch(a.last_fire_at),
            a.last_run_id,
            _epoch(a.buffered_fire_at),
            dumps(skips_to_json(a.recent_skips)),
            s.workspace,
            s.name,
            s.next_fire_at.timestamp(),
            _epoch(s.buffered_fire_at),
        )
        return bool(await self._write(lambda c: c.execute(sql, args).rowcount))

    async def record_fire(
        self, workspace: str, name: str, fire_time: datetime, run_id: str
    ) -> None:
        sql = (
            "UPDATE schedules SET last_fire_at = ?, last_run_id = ?"
            " WHERE workspace = ? AND name = ? AND (last_fire_at IS NULL OR last_fire_at <= ?)"
        )
        at = fire_time.timestamp()
        await self._write(lambda c: c.execute(sql, (at, run_id, workspace, name, at)).rowcount)

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
            _RUN_COLUMNS, "?", workspace, name, status, agent_name, limit, before
        )
        rows = await self._read(lambda c: c.execute(sql, args).fetchall())
        return [_run(r) for r in rows]

    async def run_key(self, run_id: str) -> str | None:
        sql = "SELECT idempotency_key FROM runs WHERE id = ?"
        row = await self._lookup(lambda c: c.execute(sql, (run_id,)).fetchone())
        return None if row is None else row[0]
