"""Safer defaults, in-process on both backends: a step's time limit from its node, its agent or
the server, transient failures of connectors retried without a policy, and what apply refuses."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import lantern
from lantern.demo.receiver import Receiver
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.errors import DefinitionError
from lantern.store import Store
from tests.integration.test_retries import flaky_http
from tests.integration.test_runner import graph, tool


def sleepy() -> lantern.App:
    app = lantern.App()

    @app.tool("nap")
    async def nap(seconds: float) -> dict[str, Any]:
        await asyncio.sleep(seconds)
        return {"slept": seconds}

    return app


async def drive(store: Store, definition: dict[str, Any], step_timeout: float | None) -> Any:
    await apply_agent(store, definition)
    run = await create_run(store, definition["name"], {})
    async with Worker(
        store, sleepy(), worker_id="w1", lease_ttl=60, step_timeout=step_timeout
    ) as w:
        assert w.runner is not None
        return await w.runner.drive(run.id)


def napper(seconds: float, **agent: Any) -> dict[str, Any]:
    return {**graph("napper", [tool("nap", "nap", seconds=seconds)], [("start", "nap")]), **agent}


@pytest.mark.parametrize(
    "agent, node_ms, server_s, limit",
    [
        ({}, None, 0.2, "200 ms"),  # the server's LANTERN_STEP_TIMEOUT
        ({"timeoutMs": 300}, None, 60.0, "300 ms"),  # the agent's, over the server's
        ({"timeoutMs": 60_000}, 250, 60.0, "250 ms"),  # the node's, over the agent's
    ],
)
async def test_a_step_is_stopped_at_the_nearest_time_limit(
    store: Store, agent: dict[str, Any], node_ms: int | None, server_s: float, limit: str
) -> None:
    definition = napper(30, **agent)
    if node_ms is not None:
        definition["graph"]["nodes"][1]["data"]["timeoutMs"] = node_ms
    run = await drive(store, definition, server_s)
    assert run.status == "failed", run
    assert run.error["class"] == "timeout" and f"timed out after {limit}" in run.error["message"]


async def test_a_step_within_its_limit_finishes(store: Store) -> None:
    run = await drive(store, napper(0.05), 5.0)
    assert run.status == "succeeded" and run.output == {"slept": 0.05}


async def test_a_connector_without_a_policy_retries_a_503_after_a_journaled_backoff(
    store: Store, receiver: Receiver
) -> None:
    receiver.fail("/flaky", 503, 1)
    await apply_agent(store, flaky_http(receiver))
    run = await create_run(store, "flaky", {})
    async with Worker(store, lantern.App(), worker_id="w1", lease_ttl=60) as w:
        assert w.runner is not None
        done = await w.runner.drive(run.id)
    assert done is not None
    assert done.status == "succeeded", done.error
    assert receiver.count("/flaky") == 2
    retrying = [e for e in await store.events(run.id) if e.kind == "step_retrying"]
    assert [(e.data["attempt"], e.data["of"]) for e in retrying] == [(2, 3)]
    assert 250 <= retrying[0].data["delayMs"] <= 500 and retrying[0].data["dueAt"] > 0


async def test_max_attempts_1_turns_the_default_retries_off(
    store: Store, receiver: Receiver
) -> None:
    receiver.fail("/flaky", 503, 1)
    await apply_agent(store, flaky_http(receiver, retry={"maxAttempts": 1}))
    run = await create_run(store, "flaky", {})
    async with Worker(store, lantern.App(), worker_id="w1", lease_ttl=60) as w:
        assert w.runner is not None
        done = await w.runner.drive(run.id)
    assert done is not None
    assert done.status == "failed" and receiver.count("/flaky") == 1


async def test_apply_reports_every_problem_together_naming_the_node(store: Store) -> None:
    definition = graph(
        "bad",
        [
            tool("a", x="{{ steps.b.output }}"),  # b is a sibling, not an ancestor
            tool("b", "nap", seconds="{{ steps.ghost.output }}"),
            {"id": "c", "type": "tool", "data": {"tool": "echo", "retry": {"maxAttempts": 0}}},
        ],
        [("start", "a"), ("start", "b"), ("start", "c")],
    )
    definition["retries"] = 3  # a typo of a field that does not exist
    definition["timeoutMs"] = "soon"
    with pytest.raises(DefinitionError) as caught:
        await apply_agent(store, definition, knows_tool={"nap"}.__contains__)
    problems = caught.value.problems
    expected = [
        "a graph agent has no fields retries",
        "timeoutMs must be a positive integer",
        "node 'c': retry.maxAttempts must be an integer from 1 to 100",
        "node 'a': a template reads steps.b, but 'b' is not one of its ancestors",
        "node 'b': a template reads steps.ghost, but there is no node 'ghost'",
        "node 'a': tool 'echo' is not registered by the app",
        "node 'c': tool 'echo' is not registered by the app",
    ]
    for words in expected:
        assert any(words in p for p in problems), (words, problems)
    assert len(problems) == len(expected), problems
    assert await store.get_agent("default", "bad") is None  # nothing was stored
