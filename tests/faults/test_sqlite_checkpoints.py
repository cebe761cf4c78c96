"""SQLite's write-ahead log is copied back into the database file by the store's checkpointer
thread a moment after writes, beside the writer, not by the commit of a run in flight that
happens to fill the log (bench/retention.py: a retention pass's deletions made the appends of
runs in flight pay for the checkpoints)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lantern.engine.runs import create_run
from lantern.store import open_store
from tests.conftest import sqlite_url

AGENT = {"name": "b", "graph": {"nodes": [{"id": "start", "type": "trigger"}], "edges": []}}


def size_of(path: Path) -> int:
    return path.stat().st_size


async def until_grown(db: Path, size: int, timeout: float = 10.0) -> int:
    deadline = asyncio.get_running_loop().time() + timeout
    while (now := size_of(db)) <= size:
        assert asyncio.get_running_loop().time() < deadline, "the log was never checkpointed"
        await asyncio.sleep(0.05)
    return now


async def test_the_log_is_checkpointed_soon_after_writes_not_at_a_thousand_pages(
    tmp_path: Path,
) -> None:
    db = tmp_path / "lantern.db"
    store = open_store(sqlite_url(tmp_path))
    await store.open()
    try:
        await store.put_agent("default", "b", AGENT)
        await asyncio.sleep(0.5)  # the migrations' pages, checkpointed
        before = size_of(db)
        wal = db.with_name("lantern.db-wal")
        for n in range(100):  # well under 1,000 pages of log: SQLite alone would wait
            await create_run(store, "b", {"n": n, "pad": "x" * 2000})
        assert size_of(wal) < 1000 * 4096
        after = await until_grown(db, before)
        assert after - before > 100 * 2000  # the runs are in the database file itself
    finally:
        await store.close()
    # Closed: every connection gone, the log folded in, nothing left behind.
    assert not wal.exists()
