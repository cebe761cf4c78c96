"""A workspace's secrets, sealed: the store keeps ciphertext and never sees a value."""

from __future__ import annotations

import sqlite3
import time

from lantern.store.records import SealedSecret, SecretInfo
from lantern.store.sqlite.connection import SQLiteConnection
from lantern.store.sqlite.rows import _time


class Secrets(SQLiteConnection):
    async def put_secret(self, workspace: str, name: str, key_id: str, sealed: bytes) -> SecretInfo:
        def tx(conn: sqlite3.Connection) -> SecretInfo:
            now = time.time()
            conn.execute(
                "INSERT INTO secrets (workspace, name, key_id, sealed, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (workspace, name) DO UPDATE SET"
                " key_id = excluded.key_id, sealed = excluded.sealed,"
                " updated_at = excluded.updated_at",
                (workspace, name, key_id, sealed, now, now),
            )
            sql = (
                "SELECT name, created_at, updated_at FROM secrets WHERE workspace = ? AND name = ?"
            )
            row = conn.execute(sql, (workspace, name)).fetchone()
            return SecretInfo(row[0], _time(row[1]), _time(row[2]))

        return await self._write(tx)

    async def list_secrets(self, workspace: str) -> list[SecretInfo]:
        sql = "SELECT name, created_at, updated_at FROM secrets WHERE workspace = ? ORDER BY name"
        rows = await self._read(lambda c: c.execute(sql, (workspace,)).fetchall())
        return [SecretInfo(r[0], _time(r[1]), _time(r[2])) for r in rows]

    async def delete_secret(self, workspace: str, name: str) -> bool:
        sql = "DELETE FROM secrets WHERE workspace = ? AND name = ?"
        count = await self._write(lambda c: c.execute(sql, (workspace, name)).rowcount)
        return bool(count)

    async def sealed_secrets(self, workspace: str) -> list[SealedSecret]:
        sql = "SELECT name, key_id, sealed FROM secrets WHERE workspace = ?"
        rows = await self._read(lambda c: c.execute(sql, (workspace,)).fetchall())
        return [SealedSecret(r[0], r[1], bytes(r[2])) for r in rows]
