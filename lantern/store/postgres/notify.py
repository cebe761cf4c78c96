"""Journal commit notifications between replicas: PostgreSQL ``LISTEN/NOTIFY``.

Each replica LISTENs on one channel (per schema, so databases shared by several deployments,
or by parallel tests, do not hear each other) on a connection of its own, and sends its own
commits with ``pg_notify`` from a second one, after the commit and off the journal's write
path: the appends that commit while a ``NOTIFY`` is in flight ride in the next one, coalesced
to the newest seq per run and packed many to a payload. Payload lines are ``<run id> <seq>``.

Nothing here is needed for correctness: a waiter re-reads the journal after it wakes and at
its own timeout (see ``lantern.store.notify``). So a ``NOTIFY`` that fails is dropped, and a
listening connection that drops is reopened with a backoff and then wakes every local waiter
to re-read, since it may have missed notifications meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from lantern.store.notify import Notifier

log = logging.getLogger("lantern.store.notify")

PAYLOAD_LIMIT = 7_000  # bytes per NOTIFY payload; PostgreSQL allows just under 8000
_RETRY = (0.1, 0.2, 0.5, 1.0, 2.0)  # seconds between attempts to reopen the listener


class Relay:
    """Sends this replica's commits to its peers and hands theirs to ``notifier``."""

    def __init__(self, url: str, notifier: Notifier, connect: dict[str, Any] | None = None) -> None:
        self.url = url
        self.notifier = notifier
        # The store's timeouts and keepalives, so a listener on a dead server notices it.
        self._connect: dict[str, Any] = {**(connect or {}), "autocommit": True}
        self.channel = "lantern_journal"
        self._outbox: dict[str, int] = {}
        self._pending = asyncio.Event()
        self._sender: psycopg.AsyncConnection[TupleRow] | None = None
        self._listener: psycopg.AsyncConnection[TupleRow] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Listen before returning, so a commit made on a peer after ``open()`` is heard."""
        self._listener = await self._listen()
        self._sender = await psycopg.AsyncConnection.connect(self.url, **self._connect)
        self.notifier.relay_to(self.publish)
        self._tasks = [
            asyncio.create_task(self._receive(), name="lantern-notify-listen"),
            asyncio.create_task(self._send(), name="lantern-notify-send"),
        ]

    async def close(self) -> None:
        self.notifier.relay_to(None)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with suppress(asyncio.CancelledError, Exception):
                await task
        for conn in (self._listener, self._sender):
            if conn is not None and not conn.closed:
                with suppress(Exception):
                    await conn.close()

    def publish(self, run_id: str, seq: int) -> None:
        if seq > self._outbox.get(run_id, 0):
            self._outbox[run_id] = seq
        self._pending.set()

    async def _listen(self) -> psycopg.AsyncConnection[TupleRow]:
        conn = await psycopg.AsyncConnection.connect(self.url, **self._connect)
        try:
            cur = await conn.execute("SELECT current_schema()")
            row = await cur.fetchone()
            schema = row[0] if row is not None and row[0] else "public"
            if schema != "public":
                self.channel = f"lantern_journal_{schema}"[:63]
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _receive(self) -> None:
        failures = 0
        while True:
            try:
                if self._listener is None or self._listener.closed:
                    self._listener = await self._listen()
                    self.notifier.resync()  # what was sent while we were away is unheard
                failures = 0
                async for note in self._listener.notifies():
                    self._deliver(note.payload)
            except (psycopg.Error, OSError) as exc:
                delay = _RETRY[min(failures, len(_RETRY) - 1)]
                failures += 1
                log.warning("journal notifications: listener lost (%s); again in %ss", exc, delay)
                if self._listener is not None:
                    with suppress(Exception):
                        await self._listener.close()
                    self._listener = None
                await asyncio.sleep(delay)

    def _deliver(self, payload: str) -> None:
        for line in payload.splitlines():
            run_id, _, seq = line.rpartition(" ")
            if run_id and seq.isdigit():
                self.notifier.advanced(run_id, int(seq))

    async def _send(self) -> None:
        while True:
            await self._pending.wait()
            self._pending.clear()
            batch, self._outbox = self._outbox, {}
            if not batch:
                continue
            try:
                if self._sender is None or self._sender.closed:
                    self._sender = await psycopg.AsyncConnection.connect(self.url, **self._connect)
                await self._sender.execute(
                    "SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p",
                    (self.channel, _payloads(batch)),
                )
            except (psycopg.Error, OSError) as exc:
                # A hint lost: peers' waiters find the events at their next timeout.
                log.warning("journal notifications: NOTIFY failed (%s)", exc)
                if self._sender is not None:
                    with suppress(Exception):
                        await self._sender.close()
                    self._sender = None


def _payloads(batch: dict[str, int]) -> list[str]:
    out: list[str] = []
    lines: list[str] = []
    size = 0
    for run_id, seq in batch.items():
        line = f"{run_id} {seq}"
        if lines and size + len(line) + 1 > PAYLOAD_LIMIT:
            out.append("\n".join(lines))
            lines, size = [], 0
        lines.append(line)
        size += len(line) + 1
    if lines:
        out.append("\n".join(lines))
    return out
