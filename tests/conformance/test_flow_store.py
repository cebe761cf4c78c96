"""Flow control in the claim (docs/flow-control.md), on SQLite and PostgreSQL alike: a key at
its limit starts nothing more until a run of it finishes or parks, maxConcurrentRuns bounds the
agent, priority orders the runs that may start, and one workspace's backlog does not delay
another's run. A run is claimed alike whatever its agent's kind: a graph definition stands here
for all four once its create has read the settings of its kind, as the first test shows
(tests/integration/test_flow_control.py drives graph, plain and code-first runs)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

import lantern
from lantern.engine.cancel import cancel_run
from lantern.engine.runs import apply_agent, create_run
from lantern.errors import DefinitionError, UsageError
from lantern.ids import new_run_id
from lantern.store import Append, RunUpdate, Store
from tests.conformance.helpers import DEFINITION, ev
from tests.queue_fill import fill


async def agent(store: Store, name: str, workspace: str = "default", **flow: Any) -> None:
    await store.put_agent(workspace, name, {**DEFINITION, "name": name, **flow})


async def claim(store: Store, limit: int = 10) -> list[str]:
    return [lease.run_id for lease in await store.claim_runs("w", 60, limit, ("queued",))]


async def end(store: Store, run_id: str, status: Any, worker: str = "w") -> None:
    """Open the claimed run and finish or park it, as its drive would."""
    lease = await store.acquire_lease(run_id, worker, 60)
    assert lease is not None
    await store.append(Append(lease, (ev(1, "run_started"),), RunUpdate("running")))
    await store.append(Append(lease, (ev(2, "run_ended"),), RunUpdate(status)))


KEY = {"key": "{{ input.customer }}", "limit": 1}
TRIGGER = {"nodes": [{"id": "start", "type": "trigger"}], "edges": []}


async def test_every_kind_of_agent_puts_its_runs_under_its_flow_control(store: Store) -> None:
    app = lantern.App()

    @app.agent("code", concurrency=KEY, max_concurrent_runs=3)
    async def code(ctx: lantern.Context, customer: str) -> str:
        return customer

    runtime = {"tier": "microvm", "entrypoint": "jobs:scrape"}
    for definition in (
        {"name": "graph", "concurrency": KEY, "maxConcurrentRuns": 3, "graph": TRIGGER},
        {"name": "plain", "model": "offline/echo", "concurrency": KEY, "maxConcurrentRuns": 3},
        {"name": "vm", "runtime": runtime, "concurrency": KEY, "maxConcurrentRuns": 3},
    ):
        await apply_agent(store, definition)
    for name in ("graph", "plain", "vm", "code"):
        run = await create_run(store, name, {"customer": "acme"}, app=app)
        assert run.flow is not None and (run.flow.key, run.flow.limit) == ("acme", 1), name
        assert run.flow.max_runs == 3
        assert (await store.get_run(run.id)) == run
    bad = {"key": "{{ input.customer", "limit": 0}
    with pytest.raises(DefinitionError) as refused:
        await apply_agent(store, {"name": "bad", "concurrency": bad, "graph": TRIGGER})
    assert len(refused.value.problems) == 2  # the template and the limit, together
    with pytest.raises(UsageError, match="max_concurrent_runs"):
        app.agent("worse", max_concurrent_runs=0)(code)


async def test_a_key_at_its_limit_waits_for_a_run_to_finish_or_park(store: Store) -> None:
    await agent(store, "per-customer", concurrency={"key": "{{ input.customer }}", "limit": 1})
    acme = [(await create_run(store, "per-customer", {"customer": "acme"})).id for _ in range(3)]
    bolt = await create_run(store, "per-customer", {"customer": "bolt"})
    assert bolt.flow is not None and bolt.flow.key == "bolt"
    assert sorted(await claim(store)) == sorted([acme[0], bolt.id])
    assert await claim(store) == []  # acme's slot is held: claimed, then running
    await end(store, acme[0], "succeeded")
    assert await claim(store) == [acme[1]]  # in the order they were created
    await end(store, acme[1], "waiting")  # a parked run holds no slot
    assert await claim(store) == [acme[2]]


async def test_max_concurrent_runs_bounds_the_agent_whatever_the_key(store: Store) -> None:
    await agent(
        store,
        "bounded",
        concurrency={"key": "{{ input.customer }}", "limit": 5},
        maxConcurrentRuns=2,
    )
    runs = [(await create_run(store, "bounded", {"customer": f"c{i}"})).id for i in range(4)]
    assert await claim(store) == runs[:2]
    await end(store, runs[0], "failed")
    assert await claim(store) == [runs[2]]


async def test_a_higher_priority_starts_first_then_the_oldest(store: Store) -> None:
    await agent(store, "plain-queue")
    low = await create_run(store, "plain-queue", {}, priority=1)
    mid = await create_run(store, "plain-queue", {})
    high = await create_run(store, "plain-queue", {}, priority=9)
    later_high = await create_run(store, "plain-queue", {}, priority=9)
    assert (mid.priority, high.priority) == (5, 9)
    assert [await claim(store, 1) for _ in range(4)] == [
        [high.id],
        [later_high.id],
        [mid.id],
        [low.id],
    ]
    with pytest.raises(UsageError, match="priority"):
        await create_run(store, "plain-queue", {}, priority=10)


async def test_a_backlog_of_5000_does_not_delay_another_workspaces_run(
    store: Store, database_url: str
) -> None:
    await agent(store, "busy", "busy")
    fill(database_url, "busy", "busy", 5000)
    await agent(store, "lone", "lone")
    lone = await create_run(store, "lone", {}, "lone")
    started = time.perf_counter()
    first = await claim(store, 4)
    took = time.perf_counter() - started
    assert lone.id in first, "the lone workspace's run waited behind the backlog"
    assert len(first) == 4
    # The next claim goes on with the backlog, oldest first.
    assert await claim(store, 2) == ["bulk-busy-000000003", "bulk-busy-000000004"]
    assert took < 1.0, f"one claim over 5,000 queued runs took {took:.3f} s"


async def test_a_key_that_does_not_render_refuses_the_run(store: Store) -> None:
    await agent(store, "keyed", concurrency={"key": "{{ input.customer.id }}", "limit": 1})
    with pytest.raises(UsageError, match=r"concurrency\.key"):
        await create_run(store, "keyed", {"other": 1})
    assert await store.list_runs("default") == []


async def test_a_retried_run_waits_for_its_keys_slot(store: Store) -> None:
    await agent(store, "per-customer", concurrency=KEY)
    first = await create_run(store, "per-customer", {"customer": "acme"})
    assert await claim(store) == [first.id]
    retry = await store.create_retry(replace(first, id=new_run_id(), status="waiting"), [])
    assert await claim(store) == []  # due at once, but acme's slot is held
    await end(store, first.id, "failed")
    assert await claim(store) == [retry.id]


async def test_a_run_started_on_its_own_is_decided_as_the_claim_would(store: Store) -> None:
    """Store.claim_run: the CLI's own execution and a replica's adoption of a parked run
    start one run, within its key's and agent's limits, never ahead of its key's queue."""
    await agent(
        store,
        "keyed",
        concurrency={"key": "{{ input.customer }}", "limit": 1},
        maxConcurrentRuns=2,
    )
    first, second = [(await create_run(store, "keyed", {"customer": "acme"})).id for _ in "12"]
    assert await store.claim_run(second, "cli", 60) is None  # behind acme's first run
    assert await store.claim_run(first, "cli", 60) is not None
    assert await store.claim_run(second, "cli", 60) is None  # acme's slot is held
    assert await claim(store) == []
    urgent = await create_run(store, "keyed", {"customer": "bolt"}, priority=9)
    other = await create_run(store, "keyed", {"customer": "cole"})
    assert await store.claim_run(urgent.id, "cli", 60) is not None
    assert await store.claim_run(other.id, "cli", 60) is None  # the agent's 2 are held
    await end(store, first, "waiting", "cli")  # parked: it holds no slot now
    assert await store.claim_run(second, "cli", 60) is not None
    assert await store.claim_run(first, "other", 60) is None  # adopting it waits for acme's
    await end(store, second, "succeeded", "cli")
    assert await store.claim_run(first, "other", 60) is not None
    assert await store.claim_run(other.id, "cli", 60) is None  # the agent's 2 are held
    await end(store, urgent.id, "succeeded", "cli")
    assert await store.claim_run(other.id, "cli", 60) is not None
    assert await store.claim_run(other.id, "again", 60) is None  # it has a live lease
    await agent(store, "free")  # no flow control: only the lease decides
    free = await create_run(store, "free", {})
    assert await store.claim_run(free.id, "cli", 60) is not None
    assert await store.claim_run(free.id, "cli", 60) is None


async def test_a_cancelled_run_at_the_head_of_a_full_key_leaves_the_next_to_start(
    store: Store,
) -> None:
    """A claim passes the later runs of a key at its limit (it reads one run per such key);
    the head's cancel shows the next, so the key's queue goes on once its slot frees."""
    await agent(store, "per-customer", concurrency=KEY)
    acme = [(await create_run(store, "per-customer", {"customer": "acme"})).id for _ in "123"]
    assert await claim(store) == [acme[0]]
    assert await claim(store) == []  # acme[1] and acme[2] walked past, acme[2] passed
    await cancel_run(store, acme[1], "api", 60)
    await end(store, acme[0], "succeeded")
    assert await claim(store) == [acme[2]]
