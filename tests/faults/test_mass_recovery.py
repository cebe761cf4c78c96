"""1,000 orphans of a SIGKILLed replica are re-driven by a survivor back to back: a sweep pass
still takes at most 20, but a full pass is followed at once by another while the survivor has
free slots (PostgreSQL, real processes).

The old sweep took 20 orphans an interval: any window shorter than the interval saw at most
20 recoveries. Back to back, a pass follows a full one at once, so the survivor's first window
holds many batches; that is what this test asserts, from the journal's own timestamps, so a
loaded machine cannot fail it by being slow. The time from kill to the last run finished,
whose target is TTL + interval + 10 s, is what ``bench/recovery.py --orphans 1000`` measures:
it depends on how fast the machine drives runs, which a shared test machine cannot promise.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psycopg
import pytest

from lantern.engine.recovery import BATCH
from lantern.engine.runs import apply_agent, create_run
from lantern.store import Store
from tests.crash.processes import Serve
from tests.integration.test_runner import graph, tool

pytestmark = pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
ORPHANS = 1000
TTL, INTERVAL = 3.0, 1.0


async def count(url: str, sql: str) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(sql)
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def until_count(url: str, sql: str, want: int, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while (n := await count(url, sql)) < want:
        assert time.monotonic() < deadline, f"{n} of {want} within {timeout} s"
        await asyncio.sleep(0.25)
    return time.monotonic()


async def test_a_survivor_redrives_a_thousand_orphans_quickly(store: Store, tmp_path: Path) -> None:
    await apply_agent(
        store,
        graph("hold", [tool("h", "hang")], [("start", "h")]),
    )
    for batch in range(0, ORPHANS, 50):
        await asyncio.gather(
            *(create_run(store, "hold", {"n": n}) for n in range(batch, batch + 50))
        )
    common = {"LANTERN_LEASE_TTL": f"{TTL:g}s", "LANTERN_RECOVERY_INTERVAL": f"{INTERVAL:g}s"}
    doomed = Serve(
        store.url,
        tmp_path / "doomed.log",
        **common,
        LANTERN_WORKER_ID="doomed",
        LANTERN_TEST_HANG="1",
        LANTERN_MAX_CONCURRENT_RUNS=str(ORPHANS),
    )
    survivor: Serve | None = None
    try:
        in_tool = (
            "SELECT count(*) FROM journal_events WHERE kind = 'step_started' AND step_id = 'h'"
        )
        await until_count(store.url, in_tool, ORPHANS, timeout=120)
        survivor = Serve(
            store.url, tmp_path / "survivor.log", **common, LANTERN_WORKER_ID="survivor"
        )
        await asyncio.sleep(2)  # the survivor is up and sweeping; the leases are live
        killed = time.monotonic()
        doomed.kill()
        done = "SELECT count(*) FROM runs WHERE status = 'succeeded'"
        finished = await until_count(store.url, done, ORPHANS, timeout=TTL + INTERVAL + 60)
    finally:
        if doomed.proc.poll() is None:
            doomed.kill()
        if survivor is not None:
            survivor.stop()
    took = finished - killed
    recovered = "SELECT count(*) FROM journal_events WHERE kind = 'run_recovered'"
    assert await count(store.url, recovered) == ORPHANS
    window = INTERVAL * 0.9  # one pass an interval could put at most one batch in it
    busiest = await count(
        store.url,
        "SELECT max(n) FROM (SELECT (SELECT count(*) FROM journal_events b"
        "  WHERE b.kind = 'run_recovered' AND b.at >= a.at"
        f"  AND b.at < a.at + interval '{window} seconds') AS n"
        " FROM journal_events a WHERE a.kind = 'run_recovered') w",
    )
    assert busiest > 2 * BATCH, (
        f"at most {busiest} recoveries in {window} s: passes did not follow each other"
        f" (the last orphan finished {took:.1f} s after the kill)"
    )
    twice = (
        "SELECT count(*) FROM (SELECT run_id FROM journal_events WHERE kind = 'step_completed'"
        " GROUP BY run_id, step_id HAVING count(*) > 1) d"
    )
    assert await count(store.url, twice) == 0
