"""Large outputs read back and finished runs deleted whole, on both backends."""

from __future__ import annotations

import asyncio
from typing import Any

from lantern.engine import events as ev
from lantern.engine.journal import EventWriter
from lantern.engine.retention import retention_pass
from lantern.store import Store
from lantern.store.records import RunUpdate
from tests.conformance.helpers import new_run

BIG = {"page": "x" * 40 * 1024}  # 40 KiB: over the 16 KiB inline limit, so stored apart


async def run_with(store: Store, output: Any, status: str = "succeeded") -> tuple[str, str]:
    """A run whose step ``s`` returned ``output``, left ``status``; its id and output ref."""
    run = await new_run(store)
    w = EventWriter(run.id)
    events = [w.event(ev.RUN_STARTED), w.event(ev.STEP_STARTED, step_id="s", attempt=1)]
    events.append(w.completed("s", 1, output))
    if status == "succeeded":
        events.append(w.event(ev.RUN_SUCCEEDED, {"output": None}))
    lease = await store.start_run(run.id, "w1", 60, events, RunUpdate(status))  # type: ignore[arg-type]
    assert lease is not None
    return run.id, str(events[2].data.get("outputRef"))


async def test_a_run_reads_only_the_blobs_its_journal_holds(store: Store) -> None:
    mine, ref = await run_with(store, BIG)
    other, _ = await run_with(store, {"small": 1})
    assert ref.startswith("sha256:")
    body = await store.blob(mine, ref)
    assert body is not None and len(body) > 40 * 1024
    assert await store.blob(other, ref) is None  # stored, but not this run's
    assert await store.blob(mine, "sha256:" + "0" * 64) is None


async def test_deleting_a_run_removes_it_whole_and_keeps_a_shared_blob(store: Store) -> None:
    first, ref = await run_with(store, BIG)
    second, same = await run_with(store, BIG)
    assert ref == same
    deleted = await store.delete_runs([first])
    assert deleted.runs == (first,) and deleted.blobs == 0 and deleted.rows >= 5
    assert await store.get_run(first) is None
    assert await store.events(first) == []
    assert await store.blob(second, ref) is not None  # the other run still references it
    deleted = await store.delete_runs([second])
    assert deleted.blobs == 1 and deleted.bytes > 40 * 1024
    assert await store.blob(second, ref) is None


async def test_unfinished_runs_are_never_deleted(store: Store) -> None:
    running, _ = await run_with(store, {"a": 1}, "running")
    parked, _ = await run_with(store, {"a": 1}, "waiting")
    assert (await store.delete_runs([running, parked])).runs == ()
    assert await store.get_run(running) is not None and await store.get_run(parked) is not None


async def test_retention_deletes_only_finished_runs_past_it(store: Store) -> None:
    old, _ = await run_with(store, BIG)
    running, _ = await run_with(store, {"a": 1}, "running")
    parked, _ = await run_with(store, {"a": 1}, "waiting")
    assert await store.expired_runs(None, 10) == []  # no retention anywhere: all kept
    await asyncio.sleep(1.2)
    fresh, _ = await run_with(store, {"a": 2})
    assert await store.expired_runs(3600.0, 10) == []  # nothing is an hour old
    result = await retention_pass(store, 1.0)
    assert result.runs == 1 and result.rows >= 5
    assert await store.get_run(old) is None
    for kept in (running, parked, fresh):
        assert await store.get_run(kept) is not None
        assert len(await store.events(kept)) >= 3


async def test_a_workspace_setting_overrides_the_default(store: Store) -> None:
    run_id, _ = await run_with(store, {"a": 1})
    await store.set_workspace_retention("default", 1.0)
    assert await store.workspace_retention("default") == 1.0
    await asyncio.sleep(1.2)
    assert await store.expired_runs(None, 10) == [run_id]
    assert await store.expired_runs(3600.0, 10) == [run_id]  # its own, shorter, wins
    await store.set_workspace_retention("default", 7200.0)
    assert await store.expired_runs(1.0, 10) == []  # its own, longer, wins too
    await store.set_workspace_retention("default", None)
    assert await store.expired_runs(1.0, 10) == [run_id]
    gauges = await store.storage_gauges()
    assert gauges.oldest_finished is not None and gauges.database_bytes
