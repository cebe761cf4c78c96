"""A workspace's secrets, sealed: the store keeps ciphertext and never sees a value."""

from __future__ import annotations

from lantern.store.postgres.connection import PostgresConnection
from lantern.store.records import SealedSecret, SecretInfo


class Secrets(PostgresConnection):
    async def put_secret(self, workspace: str, name: str, key_id: str, sealed: bytes) -> SecretInfo:
        row = await self._fetchone(
            "INSERT INTO secrets (workspace, name, key_id, sealed) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (workspace, name) DO UPDATE SET key_id = excluded.key_id,"
            " sealed = excluded.sealed, updated_at = now()"
            " RETURNING name, created_at, updated_at",
            (workspace, name, key_id, sealed),
        )
        assert row is not None
        return SecretInfo(row[0], row[1], row[2])

    async def list_secrets(self, workspace: str) -> list[SecretInfo]:
        rows = await self._fetchall(
            "SELECT name, created_at, updated_at FROM secrets WHERE workspace = %s ORDER BY name",
            (workspace,),
        )
        return [SecretInfo(r[0], r[1], r[2]) for r in rows]

    async def delete_secret(self, workspace: str, name: str) -> bool:
        rows = await self._fetchall(
            "DELETE FROM secrets WHERE workspace = %s AND name = %s RETURNING name",
            (workspace, name),
        )
        return bool(rows)

    async def sealed_secrets(self, workspace: str) -> list[SealedSecret]:
        rows = await self._fetchall(
            "SELECT name, key_id, sealed FROM secrets WHERE workspace = %s", (workspace,)
        )
        return [SealedSecret(r[0], r[1], bytes(r[2])) for r in rows]
