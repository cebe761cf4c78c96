"""Rate limits on model calls (lantern.store.model_limits) on SQLite: times as epoch seconds,
the window as JSON text."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence

from lantern.store.codec import dumps
from lantern.store.model_limits import ModelLimit, Slot, window_from_json, window_to_json
from lantern.store.sqlite.connection import SQLiteConnection
from lantern.store.sqlite.rows import _time

_COLUMNS = (
    "scope, name, model, tokens_per_minute, requests_per_minute, created_at, updated_at,"
    " window_slots, version"
)


def _limit(row: sqlite3.Row) -> ModelLimit:
    return ModelLimit(
        scope=row[0],
        name=row[1],
        model=row[2],
        tokens_per_minute=row[3],
        requests_per_minute=row[4],
        created_at=_time(row[5]),
        updated_at=_time(row[6]),
        window=window_from_json(json.loads(row[7])),
        version=int(row[8]),
    )


class ModelLimits(SQLiteConnection):
    async def put_limit(
        self,
        scope: str,
        name: str,
        model: str,
        tokens_per_minute: int | None,
        requests_per_minute: int | None,
    ) -> ModelLimit:
        def tx(conn: sqlite3.Connection) -> ModelLimit:
            now = time.time()
            conn.execute(
                "INSERT INTO model_limits (scope, name, model, tokens_per_minute,"
                " requests_per_minute, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (scope, name) DO UPDATE SET model = excluded.model,"
                " tokens_per_minute = excluded.tokens_per_minute,"
                " requests_per_minute = excluded.requests_per_minute,"
                " version = model_limits.version + 1, updated_at = excluded.updated_at",
                (scope, name, model, tokens_per_minute, requests_per_minute, now, now),
            )
            sql = f"SELECT {_COLUMNS} FROM model_limits WHERE scope = ? AND name = ?"
            return _limit(conn.execute(sql, (scope, name)).fetchone())

        return await self._write(tx)

    async def get_limit(self, scope: str, name: str) -> ModelLimit | None:
        sql = f"SELECT {_COLUMNS} FROM model_limits WHERE scope = ? AND name = ?"
        row = await self._read(lambda c: c.execute(sql, (scope, name)).fetchone())
        return None if row is None else _limit(row)

    async def list_limits(self, scopes: Sequence[str]) -> list[ModelLimit]:
        wanted = list(dict.fromkeys(scopes))
        if not wanted:
            return []
        marks = ",".join("?" * len(wanted))
        sql = f"SELECT {_COLUMNS} FROM model_limits WHERE scope IN ({marks}) ORDER BY scope, name"
        rows = await self._read(lambda c: c.execute(sql, wanted).fetchall())
        return [_limit(r) for r in rows]

    async def delete_limit(self, scope: str, name: str) -> bool:
        sql = "DELETE FROM model_limits WHERE scope = ? AND name = ?"
        return bool(await self._write(lambda c: c.execute(sql, (scope, name)).rowcount))

    async def swap_window(self, limit: ModelLimit, window: Sequence[Slot]) -> bool:
        sql = (
            "UPDATE model_limits SET window_slots = ?, version = version + 1"
            " WHERE scope = ? AND name = ? AND version = ?"
        )
        args = (dumps(window_to_json(window)), limit.scope, limit.name, limit.version)
        return bool(await self._write(lambda c: c.execute(sql, args).rowcount))
