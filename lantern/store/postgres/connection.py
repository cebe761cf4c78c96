"""The plumbing of the shared backend: psycopg 3's async connection pool for reads and
most writes, one dedicated connection for journal appends, and migrations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from lantern.store.migrations import migrations
from lantern.store.notify import Notifier
from lantern.store.postgres.notify import Relay

_MIGRATION_LOCK = 0x4C414E54  # "LANT": one replica migrates at a time


class PostgresConnection:
    def __init__(self, url: str, *, max_connections: int = 10) -> None:
        self.url = url
        self._pool = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=max_connections,
            open=False,
            kwargs={"autocommit": True},
            name="lantern",
        )
        self._writer: psycopg.AsyncConnection[TupleRow] | None = None
        self.notifier = Notifier()  # journal commits, relayed to the other replicas
        self._relay = Relay(url, self.notifier)

    async def open(self) -> None:
        await self._pool.open(wait=True, timeout=30)
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY,"
                " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            cur = await conn.execute("SELECT version FROM schema_migrations")
            done = {r[0] for r in await cur.fetchall()}
            for m in migrations("postgres"):
                if m.version not in done:
                    await conn.execute(m.sql.encode())
                    await conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                        (m.version, m.name),
                    )
        await self._relay.start()

    async def close(self) -> None:
        await self._relay.close()
        if self._writer is not None:
            await self._writer.close()
        await self._pool.close()

    async def _fetchall(
        self, sql: str, args: Sequence[Any] | dict[str, Any] = ()
    ) -> list[TupleRow]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql.encode(), args)
            return await cur.fetchall()

    async def _fetchone(
        self, sql: str, args: Sequence[Any] | dict[str, Any] = ()
    ) -> TupleRow | None:
        rows = await self._fetchall(sql, args)
        return rows[0] if rows else None

    async def _writer_execute(self, sql: str, params: dict[str, Any]) -> list[TupleRow]:
        """Journal writes go through one dedicated connection, kept warm.

        Group commit already writes one batch at a time, and a pool would rotate the writes
        through every connection, each with cold caches and its own prepared statements.
        """
        if self._writer is None or self._writer.closed:
            self._writer = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        try:
            cur = await self._writer.execute(sql.encode(), params)
            return await cur.fetchall()
        except psycopg.OperationalError:
            await self._writer.close()
            self._writer = None
            raise
