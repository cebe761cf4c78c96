"""Journal commit notifications between replicas: PostgreSQL ``LISTEN/NOTIFY``.

Each replica LISTENs on one channel (per schema, so databases shared by several deployments,
or by parallel tests, do not hear each other) while a run it follows is driven elsewhere (the
commits of the runs it drives wake their followers in-process), on a connection of its own
opened when something in the process first follows a run, and sends its own commits with
``pg_notify`` through the store's pool, after the commit and off the journal's write path: the
appends that commit while a ``NOTIFY`` is in flight ride in the next one, coalesced to the
newest seq per run and packed many to a payload. Payload lines are ``<run id> <seq>``,
or ``<run id> <seq> end`` for the commit that finished the run (a replica of an older version
ignores such a line: its waiter for that run's end finds it at its next re-read).

A ``NOTIFY`` is sent only while another session listens on the channel: a lone replica (or one
whose peers follow nothing) would otherwise pay a round trip per commit for no one. Whether
someone listens is looked up in ``pg_stat_activity`` (a listening connection of a relay does
nothing after its ``LISTEN``, so that is its query) at most every ``PEER_CHECK_S`` while there
are commits to tell; the commits of the last look or two are held meanwhile, so a peer that
starts listening between two looks still hears them (what it missed before it listened, its
``resync`` covers).

Nothing here is needed for correctness: a waiter re-reads the journal after it wakes and at
its own timeout (see ``lantern.store.notify``). So a ``NOTIFY`` that fails is dropped, and a
listening connection that drops is reopened with a backoff and then wakes every local waiter
to re-read, since it may have missed notifications meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from lantern.store.notify import Notifier

log = logging.getLogger("lantern.store.notify")

PAYLOAD_LIMIT = 7_000  # bytes per NOTIFY payload; PostgreSQL allows just under 8000
PEER_CHECK_S = 0.5  # how often, at most, to look whether any peer listens
LOOK_S = 0.2  # how often a listener looks whether a run followed here is driven elsewhere
LINGER_S = 5.0  # how long it listens on after the last such run, rather than flap
# Another session listening on the channel; a backend whose query this role may not see counts
# as one (sending is the safe side).
PEERS_SQL = (
    "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND pid <> %s"
    " AND datname = current_database() AND query IN (%s, '<insufficient privilege>')"
)
Outbox = dict[str, tuple[int, bool]]  # run id -> newest seq, and whether it finished
_RETRY = (0.1, 0.2, 0.5, 1.0, 2.0)
Execute = Callable[
    [str, Sequence[Any]], Awaitable[list[Any]]
]  # seconds between attempts to reopen the listener


class Relay:
    """Sends this replica's commits to its peers and hands theirs to ``notifier``.

    Commits are sent through the store's own pool (no connection of its own); the listening
    connection is opened only once something in this process subscribes to a run, so a
    replica or a command that follows nothing holds no extra connection.
    """

    def __init__(
        self,
        url: str,
        notifier: Notifier,
        execute: Execute,
        connect: dict[str, Any] | None = None,
    ) -> None:
        self.url = url
        self.notifier = notifier
        # The store's timeouts and keepalives, so a listener on a dead server notices it.
        self._connect: dict[str, Any] = {**(connect or {}), "autocommit": True}
        self.channel = "lantern_journal"
        self._execute = execute
        self._outbox: Outbox = {}
        # Commits not told while nobody listened: this look's, and the previous look's.
        self._held: Outbox = {}
        self._held_before: Outbox = {}
        self._peers = True  # someone else listened at the last look (or none was made yet)
        self._looked = 0.0  # monotonic time of that look
        self._pending = asyncio.Event()
        self._listener: psycopg.AsyncConnection[TupleRow] | None = None
        self._listens = False  # the listener has LISTENed (not UNLISTENed since)
        self._needed_at = float("-inf")  # monotonic time a run followed here was last elsewhere
        self._sender: asyncio.Task[None] | None = None
        self._receiver: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()  # set while this replica LISTENs on the channel

    async def start(self) -> None:
        rows = await self._execute("SELECT current_schema()", ())
        schema = rows[0][0] if rows and rows[0][0] else "public"
        if schema != "public":
            self.channel = f"lantern_journal_{schema}"[:63]
        self.notifier.relay_to(self.publish, self._listen_soon)
        self._sender = asyncio.create_task(self._send(), name="lantern-notify-send")

    async def close(self) -> None:
        self.notifier.relay_to(None, None)
        tasks = [t for t in (self._sender, self._receiver) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: a relay caught mid-reconnect must not hold the store's close
            await asyncio.wait(tasks, timeout=2)
        if self._listener is not None and not self._listener.closed:
            with suppress(Exception):
                await self._listener.close()

    def publish(self, run_id: str, seq: int, finished: bool = False) -> None:
        _merge(self._outbox, run_id, seq, finished)
        self._pending.set()

    def _listen_soon(self) -> None:
        """Someone here follows a run: start hearing the peers' commits (once)."""
        if self._receiver is None:
            self._receiver = asyncio.get_running_loop().create_task(
                self._receive(), name="lantern-notify-listen"
            )

    async def _receive(self) -> None:
        failures = 0
        while True:
            try:
                if self._listener is None or self._listener.closed:
                    self._listener = await psycopg.AsyncConnection.connect(
                        self.url, **self._connect
                    )
                    self._listens = False
                failures = 0
                while True:
                    await self._listen_as_needed(self._listener)
                    async for note in self._listener.notifies(timeout=LOOK_S):
                        self._deliver(note.payload)
            except (psycopg.Error, OSError) as exc:
                delay = _RETRY[min(failures, len(_RETRY) - 1)]
                failures += 1
                log.warning("journal notifications: listener lost (%s); again in %ss", exc, delay)
                self.listening.clear()
                self._listens = False
                if self._listener is not None:
                    with suppress(Exception):
                        await self._listener.close()
                    self._listener = None
                await asyncio.sleep(delay)

    async def _listen_as_needed(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        """LISTEN while a run followed here is driven elsewhere, and for ``LINGER_S`` after;
        UNLISTEN otherwise. Peers send a NOTIFY per commit only while someone listens, and a
        replica's own runs' commits are heard here without one: so replicas that each follow
        the runs they drive (a create with ``?wait``) send none (with one listening, every
        peer NOTIFYs each commit: two workers on PostgreSQL gave 0.76x-0.81x the steps/s)."""
        now = time.monotonic()
        if self.notifier.followed_elsewhere():
            self._needed_at = now
        wanted = now - self._needed_at < LINGER_S
        if wanted == self._listens:
            return
        verb = "LISTEN {}" if wanted else "UNLISTEN {}"
        await conn.execute(sql.SQL(verb).format(sql.Identifier(self.channel)))
        self._listens = wanted
        if wanted:
            self.listening.set()
            # What was committed before we listened (or while we were away) was not heard:
            # every follower reads its journal again.
            self.notifier.resync()
        else:
            self.listening.clear()

    def _deliver(self, payload: str) -> None:
        for line in payload.splitlines():
            run_id, seq, *end = line.split(" ")
            if run_id and seq.isdigit():
                self.notifier.advanced(run_id, int(seq), end == ["end"])

    async def _peers_listen(self) -> bool:
        """Whether a session other than ours (and our own listener) listens on the channel."""
        mine = self._listener.info.backend_pid if self._listener is not None else 0
        try:
            rows = await self._execute(PEERS_SQL, (mine, f'LISTEN "{self.channel}"'))
        except (psycopg.Error, OSError):
            return True  # cannot tell: tell them
        return bool(rows and rows[0][0])

    async def _send(self) -> None:
        while True:
            if self._held:  # nobody listened: look again soon, for the held commits' sake
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._pending.wait(), PEER_CHECK_S)
            else:
                await self._pending.wait()
            self._pending.clear()
            batch, self._outbox = self._outbox, {}
            if not batch and not self._held:
                continue
            if time.monotonic() - self._looked >= PEER_CHECK_S:
                self._looked = time.monotonic()
                self._peers = await self._peers_listen()
                if not self._peers:  # the previous look's commits are old enough to drop
                    self._held_before, self._held = self._held, {}
            if not self._peers:
                for run_id, (seq, finished) in batch.items():
                    _merge(self._held, run_id, seq, finished)
                continue
            for held in (self._held_before, self._held):
                for run_id, (seq, finished) in held.items():
                    _merge(batch, run_id, seq, finished)
            self._held_before, self._held = {}, {}
            if not batch:
                continue
            try:
                await self._execute(
                    "SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p",
                    (self.channel, _payloads(batch)),
                )
            except (psycopg.Error, OSError) as exc:
                # A hint lost: peers' followers find the events at their next re-read.
                log.warning("journal notifications: NOTIFY failed (%s)", exc)


def _merge(box: Outbox, run_id: str, seq: int, finished: bool) -> None:
    known, ended = box.get(run_id, (0, False))
    box[run_id] = (max(seq, known), ended or finished)


def _payloads(batch: Outbox) -> list[str]:
    out: list[str] = []
    lines: list[str] = []
    size = 0
    for run_id, (seq, finished) in batch.items():
        line = f"{run_id} {seq} end" if finished else f"{run_id} {seq}"
        if lines and size + len(line) + 1 > PAYLOAD_LIMIT:
            out.append("\n".join(lines))
            lines, size = [], 0
        lines.append(line)
        size += len(line) + 1
    if lines:
        out.append("\n".join(lines))
    return out
