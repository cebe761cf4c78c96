"""Each anomaly kind is raised by a graph built to trigger it, and not by a normal run."""

from __future__ import annotations

from typing import Any

import lantern
from lantern.engine.approvals import decide
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.store import Store
from tests.integration.test_run_control import until, worker  # noqa: F401 (a fixture)
from tests.integration.test_runner import graph, run_agent, tool


def app() -> lantern.App:
    a = lantern.App()

    @a.tool("echo")
    async def echo(**kwargs: Any) -> dict[str, Any]:
        return kwargs

    @a.tool("flaky")
    async def flaky() -> None:
        raise ConnectionError("still down")

    @a.tool("model_like")
    async def model_like(tokens: int) -> dict[str, Any]:
        return {"usage": {"inputTokens": tokens, "outputTokens": 0, "costUsd": tokens / 1000}}

    return a


def chain(name: str, steps: int, **extra: Any) -> dict[str, Any]:
    ids = [f"s{k}" for k in range(1, steps + 1)]
    edges = list(zip(["start", *ids[:-1]], ids, strict=True))
    return {**graph(name, [tool(i) for i in ids], edges), **extra}


async def anomalies(store: Store, run_id: str) -> list[dict[str, Any]]:
    return [dict(e.data) for e in await store.events(run_id) if e.kind == "anomaly_detected"]


async def test_a_normal_run_raises_nothing(store: Store) -> None:
    run = await run_agent(store, app(), chain("calm", 4), {})
    assert run.status == "succeeded"
    assert await anomalies(store, run.id) == []


async def test_a_node_repeating_past_its_bound_is_a_runaway_loop(store: Store) -> None:
    definition = graph(
        "loop",
        [
            {
                "id": "again",
                "type": "tool",
                "data": {"tool": "flaky", "retry": {"maxAttempts": 6, "backoffMs": 1}},
            }
        ],
        [("start", "again")],
    )
    definition["anomalies"] = {"runaway_loop": {"repeats": 3}, "retry_storm": {"maxRetries": 50}}
    run = await run_agent(store, app(), definition, {})
    assert run.status == "failed"  # record: the run went on to its own end
    found = await anomalies(store, run.id)
    assert [a["kind"] for a in found] == ["runaway_loop"]
    assert found[0]["detail"]["step"] == "again" and found[0]["policy"] == "record"


async def test_too_many_steps_fails_the_run_under_the_fail_policy(store: Store) -> None:
    definition = chain(
        "sprawl", 5, anomalies={"excessive_steps": {"maxSteps": 3, "policy": "fail"}}
    )
    run = await run_agent(store, app(), definition, {})
    assert run.status == "failed"
    assert run.error["code"] == "anomaly_detected" and run.error["kind"] == "excessive_steps"
    started = [e.step_id for e in await store.events(run.id) if e.kind == "step_started"]
    assert "s5" not in started


async def test_retries_past_the_run_limit_are_a_retry_storm(store: Store) -> None:
    definition = graph(
        "stormy",
        [
            {
                "id": "x",
                "type": "tool",
                "data": {"tool": "flaky", "retry": {"maxAttempts": 4, "backoffMs": 1}},
            }
        ],
        [("start", "x")],
    )
    definition["anomalies"] = {"retry_storm": {"maxRetries": 2}}
    run = await run_agent(store, app(), definition, {})
    found = await anomalies(store, run.id)
    assert [a["kind"] for a in found] == ["retry_storm"]
    assert found[0]["detail"] == {"retries": 3, "maxRetries": 2}


async def test_a_step_far_above_the_agents_median_is_a_cost_and_token_spike(
    store: Store,
) -> None:
    definition = graph(
        "spend", [tool("m", "model_like", tokens="{{ input.tokens }}")], [("start", "m")]
    )
    a = app()
    for tokens in (100, 110, 90, 105, 95):
        assert not await anomalies(
            store, (await run_agent(store, a, definition, {"tokens": tokens})).id
        )
    normal = await run_agent(store, a, definition, {"tokens": 120})
    assert await anomalies(store, normal.id) == []
    spike = await run_agent(store, a, definition, {"tokens": 5000})
    kinds = {x["kind"]: x for x in await anomalies(store, spike.id)}
    assert set(kinds) == {"token_spike", "cost_spike"}
    assert kinds["token_spike"]["detail"]["median"] == 102.5
    assert kinds["token_spike"]["detail"]["value"] == 5000


async def test_the_pause_policy_parks_the_run_until_someone_lets_it_go_on(
    store: Store,
    worker: Worker,  # noqa: F811
) -> None:
    definition = chain(
        "careful", 4, anomalies={"excessive_steps": {"maxSteps": 3, "policy": "pause"}}
    )
    await apply_agent(store, definition)
    run = await create_run(store, "careful", {})
    parked = await until(store, run.id, "waiting")
    found = await anomalies(store, run.id)
    assert [(a["kind"], a["policy"]) for a in found] == [("excessive_steps", "pause")]
    started = [e.step_id for e in await store.events(run.id) if e.kind == "step_started"]
    assert "s4" not in started
    await decide(store, parked, "anomaly:excessive_steps", "approved", "key:ops")
    done = await until(store, run.id, "succeeded", "failed")
    assert done.status == "succeeded", done.error


async def test_a_run_spending_far_above_the_agents_recent_runs_is_a_spike(store: Store) -> None:
    definition = graph(
        "many",
        [
            tool("a", "model_like", tokens="{{ input.a }}"),
            tool("b", "model_like", tokens="{{ input.b }}"),
            tool("c", "model_like", tokens="{{ input.c }}"),
        ],
        [("start", "a"), ("a", "b"), ("b", "c")],
    )
    definition["anomalies"] = {"token_spike": {"factor": 2}, "cost_spike": {"factor": 2}}
    a = app()
    for tokens in (100, 90, 110, 95, 105):
        run = await run_agent(store, a, definition, {"a": tokens, "b": 0, "c": 0})
        assert await anomalies(store, run.id) == []
    # No step is above its own median (b and c have none to compare with), but the run is.
    spike = await run_agent(store, a, definition, {"a": 100, "b": 100, "c": 100})
    found = {x["kind"]: x["detail"] for x in await anomalies(store, spike.id)}
    assert set(found) == {"token_spike", "cost_spike"}
    assert found["token_spike"] == {"scope": "run", "value": 300, "median": 100, "factor": 2}


# Every kind of run is watched by the same detector through the same ledger: a graph (above),
# a plain agent and a code-first function here, a microVM run in tests/runtime/test_relay.py
# (the control plane in-process) and tests/runtime/test_microvm_guarantees.py (a real VM).


async def test_a_plain_agent_past_its_step_bound_fails_under_the_fail_policy(
    store: Store,
) -> None:
    definition = {
        "name": "plain-sprawl",
        "model": "offline/tools",
        "tools": ["echo"],
        "anomalies": {"excessive_steps": {"maxSteps": 2, "policy": "fail"}},
    }
    run = await run_agent(store, app(), definition, "x")
    assert run.status == "failed", run
    assert run.error["code"] == "anomaly_detected" and run.error["kind"] == "excessive_steps"
    started = [e.step_id for e in await store.events(run.id) if e.kind == "step_started"]
    assert len(started) == 2, started
    [found] = await anomalies(store, run.id)
    assert (found["kind"], found["policy"]) == ("excessive_steps", "fail")


async def test_a_code_first_function_repeating_one_call_is_a_runaway_loop(store: Store) -> None:
    a = app()

    @a.agent("repeats")
    async def repeats(ctx: lantern.Context) -> int:
        for _ in range(6):  # the same tool call with the same arguments, past repeats: 5
            await ctx.tool("echo", q="same")
        return 6

    async with Worker(store, a, worker_id="w1", lease_ttl=60) as w:
        assert w.runner is not None
        run = await create_run(store, "repeats", {}, app=a)
        done = await w.runner.drive(run.id)
    assert done is not None and done.status == "succeeded"  # record: it went on
    [found] = await anomalies(store, run.id)
    assert (found["kind"], found["policy"]) == ("runaway_loop", "record")
    assert found["detail"]["started"] == 6
