"""Webhook signing secrets, receipt signing keys, and the receipts they sign."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence

from lantern.store.records import SigningKey, StoredReceipt
from lantern.store.sqlite.connection import SQLiteConnection
from lantern.store.sqlite.rows import _time
from lantern.store.sqlite.runs import in_lists, marks


class Signing(SQLiteConnection):
    # -- webhook signing secrets ------------------------------------------------------

    async def signing_secrets(self, workspace: str) -> list[str]:
        sql = (
            "SELECT secret, CASE WHEN previous_until > ? THEN previous_secret END"
            " FROM signing_secrets WHERE workspace = ?"
        )
        args = (time.time(), workspace)
        row = await self._read(lambda c: c.execute(sql, args).fetchone())
        return [] if row is None else [s for s in row if s is not None]

    async def ensure_signing_secret(self, workspace: str, secret: str) -> str:
        def tx(conn: sqlite3.Connection) -> str:
            conn.execute(
                "INSERT INTO signing_secrets (workspace, secret, created_at) VALUES (?, ?, ?)"
                " ON CONFLICT (workspace) DO NOTHING",
                (workspace, secret, time.time()),
            )
            sql = "SELECT secret FROM signing_secrets WHERE workspace = ?"
            return str(conn.execute(sql, (workspace,)).fetchone()[0])

        return await self._write(tx)

    async def rotate_signing_secret(self, workspace: str, secret: str, overlap_s: float) -> None:
        now = time.time()
        keep = overlap_s > 0
        sql = (
            "INSERT INTO signing_secrets (workspace, secret, created_at) VALUES (?, ?, ?)"
            " ON CONFLICT (workspace) DO UPDATE SET secret = excluded.secret,"
            " created_at = excluded.created_at,"
            " previous_secret = CASE WHEN ? THEN signing_secrets.secret END,"
            " previous_until = ?"
        )
        args = (workspace, secret, now, keep, now + overlap_s if keep else None)
        await self._write(lambda c: c.execute(sql, args))

    # -- receipts ---------------------------------------------------------------------

    async def journal_head(self, run_id: str) -> tuple[int, str | None]:
        sql = (
            "SELECT COUNT(*), (SELECT hash FROM journal_events WHERE run_id = ?"
            " ORDER BY seq DESC LIMIT 1) FROM journal_events WHERE run_id = ?"
        )
        row = await self._lookup(lambda c: c.execute(sql, (run_id, run_id)).fetchone())
        return int(row[0]), row[1]

    async def journal_heads(self, run_ids: Sequence[str]) -> dict[str, tuple[int, str | None]]:
        def read(conn: sqlite3.Connection) -> dict[str, tuple[int, str | None]]:
            heads: dict[str, tuple[int, str | None]] = dict.fromkeys(run_ids, (0, None))
            for ids in in_lists(run_ids):
                sql = (
                    "SELECT run_id, COUNT(*), (SELECT hash FROM journal_events l"
                    " WHERE l.run_id = j.run_id ORDER BY seq DESC LIMIT 1)"
                    f" FROM journal_events j WHERE run_id IN ({marks(ids)}) GROUP BY run_id"
                )
                for run_id, count, head in conn.execute(sql, ids):
                    heads[run_id] = (int(count), head)
            return heads

        return await self._lookup(read) if run_ids else {}

    async def register_signing_key(self, kid: str, x: str) -> None:
        sql = "INSERT INTO signing_keys VALUES (?, ?, ?) ON CONFLICT (kid) DO NOTHING"
        args = (kid, x, time.time())
        await self._write(lambda c: c.execute(sql, args))

    async def signing_keys(self) -> list[SigningKey]:
        sql = "SELECT kid, x, created_at FROM signing_keys ORDER BY created_at, kid"
        rows = await self._read(lambda c: c.execute(sql).fetchall())
        return [SigningKey(r[0], r[1], _time(r[2])) for r in rows]

    async def put_receipt(self, receipt: StoredReceipt) -> StoredReceipt:
        r = receipt

        def tx(conn: sqlite3.Connection) -> StoredReceipt:
            conn.execute(
                "INSERT INTO receipts VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
                (r.run_id, r.key_id, r.body, r.signature, time.time()),
            )
            stored = _receipt(conn, r.run_id)
            assert stored is not None
            return stored

        return await self._write(tx)

    async def put_receipts(self, receipts: Sequence[StoredReceipt]) -> None:
        now = time.time()
        rows = [(r.run_id, r.key_id, r.body, r.signature, now) for r in receipts]
        sql = "INSERT INTO receipts VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING"
        if rows:
            await self._write(lambda c: c.executemany(sql, rows))

    async def get_receipt(self, run_id: str) -> StoredReceipt | None:
        return await self._read(lambda c: _receipt(c, run_id))


def _receipt(conn: sqlite3.Connection, run_id: str) -> StoredReceipt | None:
    sql = "SELECT run_id, key_id, body, signature, created_at FROM receipts WHERE run_id = ?"
    row = conn.execute(sql, (run_id,)).fetchone()
    if row is None:
        return None
    return StoredReceipt(row[0], row[1], row[2], row[3], _time(row[4]))
