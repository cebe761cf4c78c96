"""The plumbing of the shared backend: psycopg 3's async connection pool for reads and
most writes, one dedicated connection for journal appends, and migrations.

The database going away is an expected event, not a crash. Every connection has a connect
timeout, TCP keepalives and a user timeout (a dead peer is noticed in seconds, not after the
kernel's two hours), and a statement timeout; the pool checks a connection that sat idle
before lending it and replaces broken ones in the background. A lost connection, a refused
connect or a timeout surfaces as ``StoreUnavailable``, which callers treat as "try again": a
statement that only reads is sent again here, a journal append by the engine (it carries its
sequence, so it cannot land twice).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from lantern.errors import StoreUnavailable
from lantern.store.migrations import migrations
from lantern.store.notify import Notifier
from lantern.store.postgres.notify import Relay

log = logging.getLogger("lantern.store")

_MIGRATION_LOCK = 0x4C414E54  # "LANT": one replica migrates at a time

CONNECT_TIMEOUT_S = 5  # a refused or unanswered connect fails fast; the pool tries again
STATEMENT_TIMEOUT_MS = 30_000  # no statement of ours takes this long unless something hangs
TCP_USER_TIMEOUT_MS = 10_000  # unacknowledged data for this long: the peer is gone
POOL_WAIT_S = 30  # how long a call waits for a pooled connection (busy, or reconnecting)
CHECK_IDLE_S = 1.0  # a pooled connection idle longer than this is checked before use
READ_ATTEMPTS = 3  # a read is sent again across a lost connection (nothing it did is lost)
TRANSIENT = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout)


def connection_kwargs(url: str) -> dict[str, Any]:
    """Timeouts and keepalives for every connection, keeping the URL's own ``options``."""
    options = conninfo_to_dict(url).get("options") or ""
    return {
        "autocommit": True,
        "connect_timeout": CONNECT_TIMEOUT_S,
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
        "options": f"{options} -c statement_timeout={STATEMENT_TIMEOUT_MS}".strip(),
    }


def unavailable(exc: BaseException) -> StoreUnavailable:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return StoreUnavailable(f"the database is unavailable: {first}")


class PostgresConnection:
    def __init__(self, url: str, *, max_connections: int = 10) -> None:
        self.url = url
        self._kwargs = connection_kwargs(url)
        self._pool = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=max_connections,
            open=False,
            kwargs=self._kwargs,
            name="lantern",
            check=self._check,
            timeout=POOL_WAIT_S,
        )
        self._writer: psycopg.AsyncConnection[TupleRow] | None = None
        self.notifier = Notifier()  # journal commits, relayed to the other replicas
        self._relay = Relay(url, self.notifier, self._fetchall, self._kwargs)
        self._last_used: dict[int, float] = {}  # id(connection) -> when it last worked

    async def _check(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Check a connection that sat idle before lending it (a restart of the server breaks
        idle connections silently); one in use a moment ago is not worth a round trip."""
        if time.monotonic() - self._last_used.get(id(conn), 0.0) > CHECK_IDLE_S:
            await AsyncConnectionPool.check_connection(conn)

    async def open(self) -> None:
        await self._pool.open(wait=True, timeout=30)
        async with self._connection() as conn, conn.transaction():
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

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[TupleRow]]:
        """A pooled connection; a lost or unreachable database raises StoreUnavailable."""
        try:
            async with self._pool.connection() as conn:
                yield conn
                self._last_used[id(conn)] = time.monotonic()
        except TRANSIENT as exc:
            raise unavailable(exc) from exc

    async def _fetchall(
        self, sql: str, args: Sequence[Any] | dict[str, Any] = (), *, again: bool = False
    ) -> list[TupleRow]:
        # A plain SELECT changes nothing, so sending it again is always safe; so is a write
        # the caller says lands the same however often it is sent (``again``).
        reads = sql.lstrip().upper().startswith("SELECT")
        attempts = READ_ATTEMPTS if reads or again else 1
        for attempt in range(1, attempts + 1):
            try:
                async with self._connection() as conn:
                    cur = await conn.execute(sql.encode(), args)
                    return await cur.fetchall()
            except StoreUnavailable as exc:
                if attempt == attempts:
                    raise
                log.warning("%s failed (%s); trying again", "read" if reads else "write", exc)
                await asyncio.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

    async def _fetchone(
        self, sql: str, args: Sequence[Any] | dict[str, Any] = ()
    ) -> TupleRow | None:
        rows = await self._fetchall(sql, args)
        return rows[0] if rows else None

    async def _writer_execute(self, sql: str, params: dict[str, Any]) -> list[TupleRow]:
        """Journal writes go through one dedicated connection, kept warm.

        Group commit already writes one batch at a time, and a pool would rotate the writes
        through every connection, each with cold caches and its own prepared statements. A
        broken writer connection is closed and a new one opened by the next write.
        """
        try:
            if self._writer is None or self._writer.closed:
                self._writer = await psycopg.AsyncConnection.connect(self.url, **self._kwargs)
            cur = await self._writer.execute(sql.encode(), params)
            return await cur.fetchall()
        except TRANSIENT as exc:
            if self._writer is not None:
                await self._writer.close()
            self._writer = None
            raise unavailable(exc) from exc
