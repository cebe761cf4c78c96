"""Signals (lantern.store.signals) on SQLite: one writer, so a send's checks and its insert
are one transaction no other write interleaves with."""

from __future__ import annotations

import json
import sqlite3
import time

from lantern.errors import Conflict, NotFound
from lantern.store.codec import dumps
from lantern.store.signals import Added, Signal
from lantern.store.sqlite.connection import SQLiteConnection
from lantern.store.sqlite.rows import _time

_COLUMNS = "id, run_id, name, payload, received_at"
FINISHED = ("succeeded", "failed", "cancelled")
# A parked run is made due, unless the sender read its journal up to ``wake_after`` and saw no
# wait for this signal there (then only a journal that moved on since may wait for it now).
_WAKE = (
    "UPDATE runs SET wake_at = ? WHERE id = ? AND status = 'waiting' AND (? IS NULL"
    " OR (SELECT max(seq) FROM journal_events WHERE run_id = ?) > ?)"
)


def _signal(row: sqlite3.Row) -> Signal:
    return Signal(row[0], row[1], row[2], json.loads(row[3]), _time(row[4]))


class Signals(SQLiteConnection):
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

        def tx(conn: sqlite3.Connection) -> Added:
            run = conn.execute("SELECT status FROM runs WHERE id = ?", (s.run_id,)).fetchone()
            if run is None:
                raise NotFound(f"run {s.run_id} not found")
            if idempotency_key is not None:
                found = conn.execute(
                    f"SELECT {_COLUMNS}, request_digest FROM signals"
                    " WHERE run_id = ? AND idempotency_key = ?",
                    (s.run_id, idempotency_key),
                ).fetchone()
                if found is not None:
                    return Added(_signal(found), False, found[5])
            if run[0] in FINISHED:
                raise Conflict(f"run {s.run_id} has already finished ({run[0]})")
            held = conn.execute(
                "SELECT count(*) FROM (SELECT 1 FROM signals WHERE run_id = ? LIMIT ?)",
                (s.run_id, limit),
            ).fetchone()[0]
            if held >= limit:
                raise Conflict(f"run {s.run_id} holds {limit} signals, the limit")
            now = time.time()
            conn.execute(
                "INSERT INTO signals (id, run_id, name, payload, idempotency_key,"
                " request_digest, received_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (s.id, s.run_id, s.name, dumps(s.payload), idempotency_key, request_digest, now),
            )
            conn.execute(_WAKE, (now, s.run_id, wake_after, s.run_id, wake_after))
            stored = Signal(s.id, s.run_id, s.name, s.payload, _time(now))
            return Added(stored, True, request_digest)

        return await self._write(tx)

    async def signals(self, run_id: str, name: str) -> list[Signal]:
        sql = f"SELECT {_COLUMNS} FROM signals WHERE run_id = ? AND name = ? ORDER BY position"
        rows = await self._read(lambda c: c.execute(sql, (run_id, name)).fetchall())
        return [_signal(r) for r in rows]
