"""The plumbing of the embedded backend: connections, transactions and migrations.

Every call runs as one whole transaction on a dedicated thread: writes on the writer thread
(SQLite has one writer anyway), reads on a reader thread with its own connection, which WAL
lets proceed beside a write. ``BEGIN IMMEDIATE`` takes the write lock up front, so several
processes sharing the file queue on it instead of failing mid-transaction.

A lookup of a few rows by key (a run, an API key) is the exception: it runs on the caller's
thread with a connection of its own (``_lookup``). Handing it to a thread costs several times what
the read does (a queue, a wake-up, the GIL passed twice, a future set across threads), and a
run read over HTTP takes ten of them; a WAL reader takes no lock a writer holds, so it does
not wait behind a commit. When it cannot read at once, it goes to the reader thread.

WAL checkpoints (copying the log back into the database file) run on a thread of their own,
beside the writer, a fraction of a second after writes. Left to SQLite, the commit that
fills the log past 1,000 pages does the checkpoint, holding the one writer while it copies
and syncs: an ordinary append of a run in flight paid for the pages a retention pass's
deletions wrote (bench/retention.py, per-step p99 1.6-2.8x beside deletion). SQLite's own
checkpoint stays as the safety net, at a log ten times larger.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NoReturn, TypeVar

from lantern.errors import StoreUnavailable
from lantern.store.migrations import migrations
from lantern.store.notify import Notifier

log = logging.getLogger("lantern.store")

T = TypeVar("T")

CHECKPOINT_AFTER_S = 0.2  # a write is followed by a checkpoint this soon, at most one a time
SAFETY_NET_PAGES = 10_000  # the writer checkpoints itself past this (the checkpointer stuck)


def _path(url: str) -> str:
    # sqlite:///relative/path or sqlite:////absolute/path, as SQLAlchemy spells them.
    return url.removeprefix("sqlite:///")


class SQLiteConnection:
    def __init__(self, url: str) -> None:
        self.url = url
        self.path = _path(url)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="lantern-sqlite-w")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="lantern-sqlite-r")
        self._checkpointer = ThreadPoolExecutor(1, thread_name_prefix="lantern-sqlite-c")
        self._wconn: sqlite3.Connection | None = None
        self._rconn: sqlite3.Connection | None = None
        self._lconn: sqlite3.Connection | None = None  # lookups, on the caller's thread
        self._lookups = threading.Lock()  # held only while a lookup runs: never waited on
        self._cconn: sqlite3.Connection | None = None
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_due = False
        self._closing = threading.Event()
        self.notifier = Notifier()  # journal commits, within this process only

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def tx() -> T:
            conn = self._wconn
            assert conn is not None, "store is not open"
            if conn.in_transaction:  # left open by a failure we could not roll back
                _rollback(conn)
            try:
                conn.execute("BEGIN IMMEDIATE")
                result = fn(conn)
                conn.execute("COMMIT")
            except BaseException as exc:
                # A COMMIT that failed (a full disk) may leave the transaction open: roll it
                # back, or the writer is wedged ("cannot start a transaction within a
                # transaction"). If the rollback fails too, the first error is the cause.
                _rollback(conn)
                _raise_translated(exc)
            self._checkpoint_soon()
            return result

        return await asyncio.get_running_loop().run_in_executor(self._writer, tx)

    def _checkpoint_soon(self) -> None:
        """On the writer thread after a commit: a checkpoint shortly, unless one is due."""
        with self._checkpoint_lock:
            if self._checkpoint_due or self._cconn is None:
                return
            self._checkpoint_due = True
        try:
            self._checkpointer.submit(self._checkpoint)
        except RuntimeError:  # closed meanwhile
            pass

    def _checkpoint(self) -> None:
        """A PASSIVE checkpoint on the checkpointer's connection: it copies what no reader
        still needs and waits for no one, and the writer goes on appending meanwhile."""
        self._closing.wait(CHECKPOINT_AFTER_S)  # the writes of the next moments, in one go
        with self._checkpoint_lock:
            # Cleared before it runs: a write from now on is covered by the next one.
            self._checkpoint_due = False
        conn = self._cconn
        if conn is None or self._closing.is_set():
            return
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:  # busy or a full disk: the next write asks again
            log.debug("SQLite checkpoint failed: %s", exc)

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def tx() -> T:
            conn = self._rconn
            assert conn is not None, "store is not open"
            try:
                conn.execute("BEGIN")
                try:
                    return fn(conn)
                finally:
                    conn.execute("COMMIT")
            except BaseException as exc:
                _rollback(conn)
                _raise_translated(exc)

        return await asyncio.get_running_loop().run_in_executor(self._reader, tx)

    async def _lookup(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A read of a few rows by key, here and now (see the module's note); on the reader
        thread when the database would make it wait (its lock, a busy or failing file) or
        another thread is looking up, so this never blocks the event loop on a lock."""
        conn = self._lconn
        if conn is not None and self._lookups.acquire(blocking=False):
            try:
                conn.execute("BEGIN")
                try:
                    return fn(conn)
                finally:
                    conn.execute("COMMIT")
            except sqlite3.Error:
                _rollback(conn)  # then read it as any other read, which waits and explains
            finally:
                self._lookups.release()
        return await self._read(fn)

    async def open(self) -> None:
        if self._wconn is not None:
            return
        if self.path not in ("", ":memory:"):
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        self._wconn = await loop.run_in_executor(self._writer, self._connect)
        await loop.run_in_executor(self._writer, self._hand_checkpoints_off, self._wconn)
        await self._write(self._migrate)
        self._rconn = await loop.run_in_executor(self._reader, self._connect)
        lconn = self._connect()
        lconn.execute("PRAGMA busy_timeout = 0")  # never wait on the event loop's thread
        self._lconn = lconn
        if self.path not in ("", ":memory:"):  # an in-memory database has no log
            self._cconn = await loop.run_in_executor(self._checkpointer, self._connect)

    @staticmethod
    def _hand_checkpoints_off(conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA wal_autocheckpoint = {SAFETY_NET_PAGES}")

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations"
            " (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
        for m in migrations("sqlite"):
            if m.version in done:
                continue
            # executescript would commit our transaction; run statement by statement instead.
            for statement in _statements(m.sql):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations VALUES (?, ?, ?)", (m.version, m.name, time.time())
            )

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        self._closing.set()
        pools = (
            (self._cconn, self._checkpointer),
            (self._wconn, self._writer),
            (self._rconn, self._reader),
        )
        self._cconn = None  # a checkpoint still to start finds none
        for conn, pool in pools:
            if conn is not None:
                await loop.run_in_executor(pool, conn.close)
        if self._lconn is not None:
            with self._lookups:
                self._lconn.close()
        self._wconn = self._rconn = self._lconn = None
        for pool in (self._writer, self._reader, self._checkpointer):
            pool.shutdown(wait=False)


# SQLite result codes meaning "the database cannot be used right now, try again later".
_TRANSIENT_CODES = {
    sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_READONLY,
}


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            log.warning("SQLite rollback failed: %s", exc)


def _raise_translated(exc: BaseException) -> NoReturn:
    """A full disk, an I/O error or a lock held too long becomes StoreUnavailable naming the
    real cause (e.g. "database or disk is full"); anything else is raised as it was."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(exc, sqlite3.OperationalError) and code is not None:
        if code & 0xFF in _TRANSIENT_CODES:
            raise StoreUnavailable(f"the database cannot be used now: {exc}") from exc
    raise exc


def _statements(script: str) -> list[str]:
    """Split a migration into statements (our SQL files hold no semicolons in literals); a
    trigger's body holds several, so pieces join until SQLite calls the statement complete."""
    lines = [line for line in script.splitlines() if not line.lstrip().startswith("--")]
    statements, pending = [], ""
    for piece in "\n".join(lines).split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                statements.append(pending.strip())
            pending = ""
    return statements
