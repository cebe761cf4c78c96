"""Signals (lantern.store.signals) on PostgreSQL: a send locks its run's row, so its checks
and its insert are serialised with the run's other sends and with its park."""

from __future__ import annotations

import json
from typing import Any

from lantern.errors import Conflict, NotFound
from lantern.store.codec import dumps
from lantern.store.postgres.connection import PostgresConnection
from lantern.store.signals import Added, Signal

_COLUMNS = "id, run_id, name, payload, received_at"
FINISHED = ("succeeded", "failed", "cancelled")
# A parked run is made due, unless the sender read its journal up to ``wake_after`` and saw no
# wait for this signal there (then only a journal that moved on since may wait for it now).
_WAKE = (
    "UPDATE runs SET wake_at = now() WHERE id = %s AND status = 'waiting' AND (%s::bigint IS NULL"
    " OR (SELECT max(seq) FROM journal_events WHERE run_id = %s) > %s)"
)


def _signal(row: Any) -> Signal:
    return Signal(row[0], row[1], row[2], json.loads(row[3]), row[4])


class Signals(PostgresConnection):
    async def add_signal(
        self,
        signal: Signal,
        *,
        idempotency_key: str | None,
        request_digest: str | None,
        limit: int,
        wake_after: int | None = None,
    ) -> Added:
        s = signal
        async with self._connection() as conn, conn.transaction():
            # The run's row first, as a decision does: a run parking now commits that before
            # this goes on, so it is seen waiting and woken below; or its park waits for this
            # send to commit and finds the signal when it looks once more.
            cur = await conn.execute(
                "SELECT status FROM runs WHERE id = %s FOR UPDATE", (s.run_id,)
            )
            run = await cur.fetchone()
            if run is None:
                raise NotFound(f"run {s.run_id} not found")
            if idempotency_key is not None:
                cur = await conn.execute(
                    f"SELECT {_COLUMNS}, request_digest FROM signals"
                    " WHERE run_id = %s AND idempotency_key = %s",
                    (s.run_id, idempotency_key),
                )
                found = await cur.fetchone()
                if found is not None:
                    return Added(_signal(found), False, found[5])
            if run[0] in FINISHED:
                raise Conflict(f"run {s.run_id} has already finished ({run[0]})")
            cur = await conn.execute(
                "SELECT count(*) FROM (SELECT 1 FROM signals WHERE run_id = %s LIMIT %s) held",
                (s.run_id, limit),
            )
            held = await cur.fetchone()
            if held is not None and held[0] >= limit:
                raise Conflict(f"run {s.run_id} holds {limit} signals, the limit")
            cur = await conn.execute(
                "INSERT INTO signals (id, run_id, name, payload, idempotency_key, request_digest)"
                " VALUES (%s, %s, %s, %s, %s, %s) RETURNING received_at",
                (s.id, s.run_id, s.name, dumps(s.payload), idempotency_key, request_digest),
            )
            row = await cur.fetchone()
            assert row is not None
            await conn.execute(_WAKE, (s.run_id, wake_after, s.run_id, wake_after))
        stored = Signal(s.id, s.run_id, s.name, s.payload, row[0])
        return Added(stored, True, request_digest)

    async def signals(self, run_id: str, name: str) -> list[Signal]:
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM signals WHERE run_id = %s AND name = %s ORDER BY position",
            (run_id, name),
        )
        return [_signal(r) for r in rows]
