"""Rate limits on model calls (lantern.store.model_limits) on PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb

from lantern.store.model_limits import ModelLimit, Slot, window_from_json, window_to_json
from lantern.store.postgres.connection import PostgresConnection

_COLUMNS = (
    "scope, name, model, tokens_per_minute, requests_per_minute, created_at, updated_at,"
    " window_slots, version"
)


def _limit(row: TupleRow) -> ModelLimit:
    return ModelLimit(
        scope=row[0],
        name=row[1],
        model=row[2],
        tokens_per_minute=row[3],
        requests_per_minute=row[4],
        created_at=row[5],
        updated_at=row[6],
        window=window_from_json(row[7]),
        version=int(row[8]),
    )


class ModelLimits(PostgresConnection):
    async def put_limit(
        self,
        scope: str,
        name: str,
        model: str,
        tokens_per_minute: int | None,
        requests_per_minute: int | None,
    ) -> ModelLimit:
        row = await self._fetchone(
            "INSERT INTO model_limits (scope, name, model, tokens_per_minute,"
            " requests_per_minute) VALUES (%s, %s, %s, %s, %s) ON CONFLICT (scope, name)"
            " DO UPDATE SET model = excluded.model,"
            " tokens_per_minute = excluded.tokens_per_minute,"
            " requests_per_minute = excluded.requests_per_minute,"
            " version = model_limits.version + 1, updated_at = now()"
            f" RETURNING {_COLUMNS}",
            (scope, name, model, tokens_per_minute, requests_per_minute),
        )
        assert row is not None
        return _limit(row)

    async def get_limit(self, scope: str, name: str) -> ModelLimit | None:
        row = await self._fetchone(
            f"SELECT {_COLUMNS} FROM model_limits WHERE scope = %s AND name = %s", (scope, name)
        )
        return None if row is None else _limit(row)

    async def list_limits(self, scopes: Sequence[str]) -> list[ModelLimit]:
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM model_limits WHERE scope = ANY(%s) ORDER BY scope, name",
            (list(dict.fromkeys(scopes)),),
        )
        return [_limit(r) for r in rows]

    async def delete_limit(self, scope: str, name: str) -> bool:
        rows = await self._fetchall(
            "DELETE FROM model_limits WHERE scope = %s AND name = %s RETURNING name",
            (scope, name),
        )
        return bool(rows)

    async def swap_window(self, limit: ModelLimit, window: Sequence[Slot]) -> bool:
        rows = await self._fetchall(
            "UPDATE model_limits SET window_slots = %s, version = version + 1"
            " WHERE scope = %s AND name = %s AND version = %s RETURNING version",
            (Jsonb(window_to_json(window)), limit.scope, limit.name, limit.version),
        )
        return bool(rows)
