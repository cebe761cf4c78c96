"""Run usage is kept by the database with the events that carry it (both backends)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from lantern.engine.journal import EventWriter
from lantern.errors import LeaseLost
from lantern.store import Append, RunUpdate, Store
from lantern.store.records import RunUsage
from tests.conformance.helpers import new_run

USAGE = {"inputTokens": 100, "outputTokens": 20, "costUsd": 0.00125, "modelCalls": 1}


async def test_usage_is_summed_in_the_transaction_of_its_step_completed(store: Store) -> None:
    run = await new_run(store)
    other = await new_run(store)
    lease = await store.acquire_lease(run.id, "w1", ttl=60)
    assert lease is not None
    w = EventWriter(run.id)
    await store.append(Append(lease, (w.event("run_started"),), RunUpdate("running")))
    await store.append(
        Append(
            lease,
            (
                w.completed("a", 1, {"text": "x"}, usage=USAGE),
                w.completed("b", 1, {"plain": "tool output", "usage": USAGE}),  # not counted
                w.completed("c", 1, "y" * 20_000, usage=USAGE),  # a blob output still counts
            ),
        )
    )
    stored = await store.get_run(run.id)
    assert stored is not None
    assert stored.usage == RunUsage(200, 40, pytest.approx(0.0025), 2)  # type: ignore[arg-type]
    untouched = await store.get_run(other.id)
    assert untouched is not None and untouched.usage == RunUsage()
    listed = await store.list_runs("default")
    assert {r.id: r.usage.model_calls for r in listed} == {run.id: 2, other.id: 0}


async def test_a_fenced_append_adds_no_usage(store: Store) -> None:
    run = await new_run(store)
    stale = await store.acquire_lease(run.id, "w1", ttl=0.05)
    assert stale is not None
    w = EventWriter(run.id)
    await store.append(Append(stale, (w.event("run_started"),), RunUpdate("running")))
    import asyncio

    await asyncio.sleep(0.1)
    assert await store.acquire_lease(run.id, "w2", ttl=60) is not None
    with pytest.raises(LeaseLost):
        await store.append(Append(stale, (w.completed("a", 1, {}, usage=USAGE),)))
    stored = await store.get_run(run.id)
    assert stored is not None and stored.usage == RunUsage()


async def test_workspace_usage_sums_the_workspaces_runs_since_a_time(store: Store) -> None:
    for _ in range(2):
        run = await new_run(store)
        lease = await store.acquire_lease(run.id, "w1", ttl=60)
        assert lease is not None
        w = EventWriter(run.id)
        await store.append(Append(lease, (w.completed("a", 1, {}, usage=USAGE),)))
    past = datetime.now(UTC) - timedelta(hours=1)
    total = await store.workspace_usage("default", past)
    assert (total.input_tokens, total.output_tokens, total.model_calls) == (200, 40, 2)
    assert total.cost_usd == pytest.approx(0.0025)
    assert await store.workspace_usage("elsewhere", past) == RunUsage()
    later = datetime.now(UTC) + timedelta(hours=1)
    assert (await store.workspace_usage("default", later)).model_calls == 0
