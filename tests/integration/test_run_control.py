"""Approvals that park a run, sub-agents and cancellation, through a real worker loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import lantern
from lantern.engine.approvals import decide
from lantern.engine.cancel import cancel_run
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.errors import Conflict
from lantern.ids import child_run_id
from lantern.store import Store
from lantern.store.records import Run
from tests.integration.test_runner import graph, tool


def app() -> lantern.App:
    a = lantern.App()

    @a.tool("echo")
    async def echo(**kwargs: Any) -> dict[str, Any]:
        return kwargs

    @a.tool("fail")
    async def fail() -> None:
        raise lantern.StepError("the child gave up", error_class="tool")

    @a.tool("block")
    async def block() -> None:
        await asyncio.sleep(60)

    return a


GATE = {
    "name": "gate",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {
                "id": "ok",
                "type": "approval",
                "data": {"prompt": "Send {{ input.item }}?", "assignees": ["ops"]},
            },
            tool("send", what="{{ input.item }}", how="{{ steps.ok.output.decision }}"),
        ],
        "edges": [{"source": "start", "target": "ok"}, {"source": "ok", "target": "send"}],
    },
}


@pytest.fixture
async def worker(store: Store) -> AsyncIterator[Worker]:
    async with Worker(store, app(), worker_id="w1", lease_ttl=60, poll_interval=0.05) as w:
        task = asyncio.create_task(w.serve())
        yield w
        await w.stop(grace=1)
        await task


async def until(store: Store, run_id: str, *statuses: str, timeout: float = 20) -> Run:
    async with asyncio.timeout(timeout):
        while True:
            run = await store.get_run(run_id)
            assert run is not None
            if run.status in statuses:
                return run
            await asyncio.sleep(0.02)


async def kinds(store: Store, run_id: str) -> list[str]:
    return [e.kind for e in await store.events(run_id)]


async def test_an_approval_parks_the_run_without_a_lease_until_approved(
    store: Store, worker: Worker
) -> None:
    await apply_agent(store, GATE)
    run = await create_run(store, "gate", {"item": "a book"})
    parked = await until(store, run.id, "waiting")
    waiting = [e for e in await store.events(run.id) if e.kind == "step_waiting"]
    assert waiting[0].step_id == "ok"
    assert waiting[0].data["prompt"] == "Send a book?" and waiting[0].data["assignees"] == ["ops"]
    # It holds no lease while it waits.
    assert all(run.id not in w.runs for w in await store.list_workers())

    made = await decide(store, parked, "ok", "approved", "key:ada", "fine")
    assert made.decided_by == "key:ada"
    with pytest.raises(Conflict, match=r"already been decided|not waiting"):
        await decide(store, parked, "ok", "rejected", "key:bob")
    done = await until(store, run.id, "succeeded", "failed")
    assert done.status == "succeeded", done.error
    assert done.output == {"what": "a book", "how": "approved"}
    events = await store.events(run.id)
    resumed = next(e for e in events if e.kind == "step_resumed")
    assert resumed.data == {
        "decision": "approved",
        "by": "key:ada",
        "comment": "fine",
        "approver": {"keyId": "ada", "keyName": None},  # who, as the journal keeps it
    }
    assert "run_recovered" not in [e.kind for e in events]  # a wake is not a recovery


async def test_a_rejection_follows_the_rejected_edge(store: Store, worker: Worker) -> None:
    definition = {
        "name": "fork",
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "ok", "type": "approval", "data": {"prompt": "Ship?"}},
                tool("ship"),
                tool("apologise", why="{{ steps.ok.output.comment }}"),
            ],
            "edges": [
                {"source": "start", "target": "ok"},
                {"source": "ok", "target": "ship"},
                {"source": "ok", "target": "apologise", "on": "rejected"},
            ],
        },
    }
    await apply_agent(store, definition)
    run = await create_run(store, "fork", {})
    parked = await until(store, run.id, "waiting")
    await decide(store, parked, "ok", "rejected", "key:ada", "out of stock")
    done = await until(store, run.id, "succeeded", "failed")
    assert done.status == "succeeded", done.error
    assert done.output == {"why": "out of stock"}  # the one final node that ran
    started = {e.step_id for e in await store.events(run.id) if e.kind == "step_started"}
    assert "ship" not in started and "apologise" in started


async def test_a_rejection_without_a_rejected_edge_fails_the_run(
    store: Store, worker: Worker
) -> None:
    await apply_agent(store, GATE)
    run = await create_run(store, "gate", {"item": "x"})
    parked = await until(store, run.id, "waiting")
    await decide(store, parked, "ok", "rejected", "key:ada", "no")
    done = await until(store, run.id, "failed")
    assert done.error["step"] == "ok"
    assert "rejected by key:ada: no" in done.error["message"]


async def test_an_approval_timeout_decides_on_its_own(store: Store, worker: Worker) -> None:
    definition = graph(
        "timed",
        [
            {
                "id": "ok",
                "type": "approval",
                "data": {"prompt": "?", "timeoutMs": 300, "onTimeout": "approve"},
            },
            tool("after"),
        ],
        [("start", "ok"), ("ok", "after")],
    )
    await apply_agent(store, definition)
    run = await create_run(store, "timed", {})
    await until(store, run.id, "waiting")
    done = await until(store, run.id, "succeeded", "failed")
    assert done.status == "succeeded"
    resumed = next(e for e in await store.events(run.id) if e.kind == "step_resumed")
    assert resumed.data["decision"] == "approved" and resumed.data["by"] == "timeout"


async def test_a_decision_at_a_node_that_is_not_waiting_is_a_conflict(
    store: Store, worker: Worker
) -> None:
    await apply_agent(store, GATE)
    run = await create_run(store, "gate", {"item": "x"})
    parked = await until(store, run.id, "waiting")
    with pytest.raises(Conflict, match="not waiting for a decision at node 'send'"):
        await decide(store, parked, "send", "approved", "key:ada")
    assert await store.decisions(run.id) == {}


async def test_a_subagent_runs_a_child_and_the_parent_continues_with_its_output(
    store: Store, worker: Worker
) -> None:
    await apply_agent(
        store, graph("child", [tool("shout", text="{{ input.text }}!")], [("start", "shout")])
    )
    parent = graph(
        "parent",
        [
            {
                "id": "kid",
                "type": "subagent",
                "data": {"agentName": "child", "input": {"text": "{{ input.word }}"}},
            },
            tool("use", said="{{ steps.kid.output.text }}"),
        ],
        [("start", "kid"), ("kid", "use")],
    )
    await apply_agent(store, parent)
    run = await create_run(store, "parent", {"word": "hello"})
    done = await until(store, run.id, "succeeded", "failed")
    assert done.status == "succeeded", done.error
    assert done.output == {"said": "hello!"}
    children = await store.children(run.id)
    assert [c.id for c in children] == [child_run_id(run.id, "kid", 1)]
    assert children[0].parent_id == run.id and children[0].status == "succeeded"
    resumed = next(e for e in await store.events(run.id) if e.kind == "step_resumed")
    assert resumed.data == {"childRunId": children[0].id, "status": "succeeded"}


async def test_a_failed_child_fails_its_step_with_the_tool_class(
    store: Store, worker: Worker
) -> None:
    await apply_agent(store, graph("bad-child", [tool("f", "fail")], [("start", "f")]))
    parent = graph(
        "parent2",
        [{"id": "kid", "type": "subagent", "data": {"agentName": "bad-child"}}],
        [("start", "kid")],
    )
    await apply_agent(store, parent)
    run = await create_run(store, "parent2", {})
    done = await until(store, run.id, "failed")
    assert done.error["class"] == "tool" and done.error["step"] == "kid"
    assert "the child gave up" in done.error["message"]


async def test_a_subagent_of_an_unknown_agent_fails_at_once(store: Store, worker: Worker) -> None:
    parent = graph(
        "orphan",
        [{"id": "kid", "type": "subagent", "data": {"agentName": "nobody"}}],
        [("start", "kid")],
    )
    await apply_agent(store, parent)
    run = await create_run(store, "orphan", {})
    done = await until(store, run.id, "failed")
    assert "nobody" in done.error["message"]


async def test_cancelling_a_waiting_run_finishes_it_at_once(store: Store, worker: Worker) -> None:
    await apply_agent(store, GATE)
    run = await create_run(store, "gate", {"item": "x"})
    await until(store, run.id, "waiting")
    cancelled = await cancel_run(store, run.id, "api", 60)
    assert cancelled.status == "cancelled"
    assert (await kinds(store, run.id))[-1] == "run_cancelled"
    with pytest.raises(Conflict):
        await decide(store, cancelled, "ok", "approved", "key:ada")


async def test_a_cancel_that_finds_a_waiting_run_held_waits_and_answers_it_cancelled(
    store: Store, worker: Worker
) -> None:
    # A cancel that lands as the drive that parked the run lets go races that drive's own look
    # for the flag (cancel.finish_if_free): one of them takes the lease and finishes the run.
    # The cancel that lost answered "waiting" (tests/integration/test_large_outputs.py flaked
    # so). Here the other party holds the lease as a cancel's finisher does, then lets go
    # unfinished: the cancel waits, then finishes the run itself. The race and the wait are
    # the same for every kind of run with a drive (graph, plain, code-first), and for a
    # microVM run whose VM no runtime node has taken (vm_cancel): they look only at the
    # run's status and lease.
    await apply_agent(store, GATE)
    run = await create_run(store, "gate", {"item": "x"})
    await until(store, run.id, "waiting")
    assert await store.request_cancel(run.id)
    other = await store.acquire_lease(run.id, "w2:cancel", 60, reclaim=False)
    assert other is not None
    cancelling = asyncio.create_task(cancel_run(store, run.id, "api", 60))
    await asyncio.sleep(0.3)
    await store.release_lease(other)
    cancelled = await cancelling
    assert cancelled.status == "cancelled"
    assert (await kinds(store, run.id)).count("run_cancelled") == 1


async def test_cancelling_a_parent_cancels_its_running_child(store: Store, worker: Worker) -> None:
    await apply_agent(store, graph("slow-child", [tool("b", "block")], [("start", "b")]))
    await apply_agent(
        store,
        graph(
            "slow-parent",
            [{"id": "kid", "type": "subagent", "data": {"agentName": "slow-child"}}],
            [("start", "kid")],
        ),
    )
    run = await create_run(store, "slow-parent", {})
    await until(store, run.id, "waiting")
    child_id = child_run_id(run.id, "kid", 1)
    await until(store, child_id, "running")
    await cancel_run(store, run.id, "api", 60)
    assert (await until(store, run.id, "cancelled")).status == "cancelled"
    assert (await until(store, child_id, "cancelled")).status == "cancelled"


async def test_cancelling_a_running_run_stops_it_at_the_next_boundary(
    store: Store, worker: Worker
) -> None:
    await apply_agent(store, graph("busy", [tool("b", "block")], [("start", "b")]))
    run = await create_run(store, "busy", {})
    await until(store, run.id, "running")
    await cancel_run(store, run.id, "api", 60)
    done = await until(store, run.id, "cancelled")
    assert done.error["code"] == "cancelled"
