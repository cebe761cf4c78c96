"""Cancelling the root of a very deep chain of sub-agent runs cancels every run in it: a
worklist, not recursion (a chain deeper than Python's stack once raised RecursionError)."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime

import pytest

from lantern.engine.cancel import cancel_run
from lantern.engine.runs import apply_agent
from lantern.store import Store
from lantern.store.records import Run

AGENT = {
    "name": "deep",
    "graph": {"nodes": [{"id": "start", "type": "trigger"}], "edges": []},
}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # the walk, not the SQL
async def test_a_chain_deeper_than_the_stack_is_cancelled_whole(store: Store) -> None:
    await apply_agent(store, AGENT)
    depth = sys.getrecursionlimit() + 50
    parent: str | None = None
    ids = []
    now = datetime.now(UTC)
    for i in range(depth):
        run = Run(
            f"run_deep_{i:06d}",
            "default",
            "deep",
            0,
            "queued",
            {},
            None,
            None,
            now,
            now,
            parent_id=parent,
        )
        ids.append((await store.create_run(run)).id)
        parent = ids[-1]
    started = time.monotonic()
    cancelled = await cancel_run(store, ids[0], "w-cancel", 60)
    took = time.monotonic() - started
    assert cancelled.status == "cancelled"
    for run_id in (ids[1], ids[depth // 2], ids[-1]):
        found = await store.get_run(run_id)
        assert found is not None and found.status == "cancelled", found
    assert took < 120
