"""A 10,000-event run read page by page: every event once, in order, each page one index range
scan on (run_id, seq) that reads the page and no more, at the start as at the end (the plan
of the store's own statement, both backends). The cost in microseconds is bench/ work:
bench/concurrency.py --pages prints it at the start and at the end."""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg

from lantern.engine.journal import EventWriter
from lantern.store import Append, Store
from lantern.store.postgres import journal as pg_journal
from lantern.store.sqlite import journal as sqlite_journal
from tests.conformance.helpers import new_run

EVENTS = 10_000
PAGE = 500


async def long_run(store: Store) -> str:
    run = await new_run(store)
    lease = await store.acquire_lease(run.id, "w1", ttl=600)
    assert lease is not None
    w = EventWriter(run.id)
    for start in range(0, EVENTS, 1000):
        batch = tuple(
            w.event("step_started", {"n": n}, step_id=f"s{n}") for n in range(start, start + 1000)
        )
        await store.append(Append(lease, batch))
    return run.id


def pg_rows_read(url: str, run_id: str, after: int) -> int:
    """Rows the page's statement read (EXPLAIN ANALYZE of the store's own SQL)."""
    with psycopg.connect(url) as conn:
        # A live database has statistics (autovacuum analyzes a table as it grows); this
        # schema was made a second ago, and without them the planner guesses 13 rows.
        conn.execute("ANALYZE journal_events")
        row = conn.execute(
            ("EXPLAIN (ANALYZE, FORMAT JSON) " + pg_journal.EVENTS_PAGE).encode(),
            (run_id, after, PAGE),
        ).fetchone()
    assert row is not None
    plan: dict[str, Any] = row[0][0]["Plan"]

    def reads(node: dict[str, Any]) -> list[dict[str, Any]]:
        """The nodes that read the table's rows (an index scan, or a bitmap heap scan)."""
        found = [node] if "Relation Name" in node else []
        for child in node.get("Plans", []):
            found += reads(child)
        return found

    (scan,) = reads(plan)
    assert scan["Index Name" if "Index Name" in scan else "Recheck Cond"], scan
    return int(scan["Actual Rows"]) + int(scan.get("Rows Removed by Filter", 0))


def sqlite_plan(path: str) -> str:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "EXPLAIN QUERY PLAN " + sqlite_journal.EVENTS_PAGE, ("r", 0, PAGE)
        ).fetchall()
    return " | ".join(str(r[-1]) for r in rows)


async def test_a_long_journal_is_paged_at_a_cost_independent_of_position(
    store: Store, database_url: str
) -> None:
    run_id = await long_run(store)
    seen: list[int] = []
    after = 0
    while True:
        page = await store.events(run_id, after=after, limit=PAGE)
        if not page:
            break
        assert len(page) <= PAGE
        seen += [e.seq for e in page]
        after = page[-1].seq
    assert seen == list(range(1, EVENTS + 1))
    if database_url.startswith("postgres"):
        start, end = (pg_rows_read(database_url, run_id, a) for a in (0, EVENTS - PAGE))
        assert start == end == PAGE  # each page reads its own rows only
    else:
        plan = sqlite_plan(database_url.removeprefix("sqlite:///"))
        assert "SEARCH journal_events USING" in plan and "seq>?" in plan, plan
        assert "TEMP B-TREE" not in plan, plan  # the key gives the order: no sort of the rest
