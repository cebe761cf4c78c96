"""Plain LLM agents in-process, through the real SDKs against the fake provider."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import lantern
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.ids import idempotency_key
from lantern.models.registry import Models
from lantern.store import Store
from tests.fake_llm import FakeProvider, Script


def app(calls: list[str]) -> lantern.App:
    a = lantern.App()

    @a.tool("crm.lookup")
    async def lookup(ctx: lantern.ToolContext, id: str) -> dict[str, str]:
        """Find a customer by id."""
        calls.append(ctx.step_id)
        if id == "boom":
            raise RuntimeError("the CRM is down")
        return {"id": id, "name": "Ada"}

    return a


async def drive(store: Store, definition: dict[str, Any], message: Any, calls: list[str]) -> Any:
    await apply_agent(store, definition)
    run = await create_run(store, definition["name"], message)
    async with Worker(store, app(calls), worker_id="w1", lease_ttl=60) as w:
        assert w.runner is not None
        await w.runner.drive(run.id)
    return await store.get_run(run.id)


def helper(model: str, **extra: Any) -> dict[str, Any]:
    return {"name": "helper", "model": model, "system": "Help.", "tools": ["crm.lookup"], **extra}


async def test_anthropic_tool_use_and_results_in_its_native_format(
    store: Store, fake: FakeProvider
) -> None:
    fake.script = Script(
        [[("crm_lookup", {"id": "c-1"}), ("crm_lookup", {"id": "c-2"})], "Both are Ada."]
    )
    calls: list[str] = []
    run = await drive(store, helper("claude-haiku-4-5"), "Who are c-1 and c-2?", calls)
    assert run.status == "succeeded", run.error
    assert run.output["text"] == "Both are Ada." and run.output["turns"] == 2
    assert calls == ["tool:1:crm.lookup", "tool:1:crm.lookup:2"]
    first, second = fake.calls()
    assert first.body["system"] == "Help."
    tool = first.body["tools"][0]
    assert tool["name"] == "crm_lookup" and tool["description"] == "Find a customer by id."
    assert tool["input_schema"]["required"] == ["id"]
    user, assistant, results = second.body["messages"]
    assert user == {"role": "user", "content": "Who are c-1 and c-2?"}
    assert [b["type"] for b in assistant["content"]] == ["tool_use", "tool_use"]
    assert results["role"] == "user"
    assert [b["tool_use_id"] for b in results["content"]] == [b["id"] for b in assistant["content"]]
    assert json.loads(results["content"][1]["content"]) == {"id": "c-2", "name": "Ada"}
    assert [c.key for c in fake.calls()] == [
        idempotency_key(run.id, "llm:1", 1),
        idempotency_key(run.id, "llm:2", 1),
    ]
    assert run.usage.model_calls == 2


async def test_a_failing_tool_is_answered_to_the_model(store: Store, fake: FakeProvider) -> None:
    fake.script = Script([[("crm_lookup", {"id": "boom"}), ("nope", {})], "Sorry."])
    run = await drive(store, helper("gpt-4o-mini"), "Who is boom?", [])
    assert run.status == "succeeded", run.error
    messages = fake.calls()[1].body["messages"]
    answers = [json.loads(m["content"]) for m in messages if m["role"] == "tool"]
    assert answers == [
        {"error": "RuntimeError: the CRM is down"},
        {"error": "there is no tool 'nope'"},
    ]


async def test_invalid_arguments_are_answered_to_the_model(
    store: Store, fake: FakeProvider
) -> None:
    fake.script = Script([[("crm_lookup", {"name": "x"})], "Oops."])
    calls: list[str] = []
    run = await drive(store, helper("gpt-4o-mini"), "?", calls)
    assert run.status == "succeeded" and calls == []  # the tool never ran
    (answer,) = [m for m in fake.calls()[1].body["messages"] if m["role"] == "tool"]
    assert "invalid arguments for 'crm.lookup'" in json.loads(answer["content"])["error"]


async def test_max_turns_fails_a_run_that_keeps_calling_tools(
    store: Store, fake: FakeProvider
) -> None:
    fake.script = Script([[("crm_lookup", {"id": "c-1"})]])  # forever
    run = await drive(store, helper("gpt-4o-mini", maxTurns=2), "loop", [])
    assert run.status == "failed" and run.error["code"] == "max_turns_exceeded"
    assert len(fake.calls()) == 2


async def test_an_unregistered_tool_fails_before_the_provider_is_called(
    store: Store, fake: FakeProvider
) -> None:
    definition = helper("gpt-4o-mini", tools=["crm.lookup", "billing.charge"])
    run = await drive(store, definition, "hi", [])
    assert run.status == "failed" and run.error["step"] == "llm:1"
    assert "'billing.charge' is not registered" in run.error["message"]
    assert fake.calls() == []


async def test_an_offline_plain_agent_needs_no_key(store: Store) -> None:
    run = await drive(store, {"name": "echo", "model": "offline/echo"}, {"message": "hello"}, [])
    assert run.status == "succeeded"
    assert run.output == {
        "text": "hello",
        "model": "offline/echo",
        "provider": "offline",
        "turns": 1,
    }


async def test_a_plain_agent_cancelled_mid_turn_stops_there(
    store: Store, fake: FakeProvider
) -> None:
    import asyncio

    fake.script = Script([[("crm_lookup", {"id": "c-1"})], "done"])
    fake.hold(after=1)  # the second turn never answers until released
    await apply_agent(store, helper("gpt-4o-mini"))
    run = await create_run(store, "helper", "hi")
    async with Worker(store, app([]), worker_id="w1", lease_ttl=60) as w:
        assert w.runner is not None
        driving = asyncio.ensure_future(w.runner.drive(run.id))
        assert await asyncio.to_thread(fake.arrived.wait, 30)
        assert await store.request_cancel(run.id)
        done = await asyncio.wait_for(driving, 30)
    fake.release()
    assert done is not None and done.status == "cancelled"
    events = await store.events(run.id)
    assert [e.step_id for e in events if e.kind == "step_completed"] == [
        "llm:1",
        "tool:1:crm.lookup",
    ]
    assert events[-1].kind == "run_cancelled"


async def test_a_model_turn_is_retried_with_the_agents_policy_and_a_new_key(
    store: Store, fake: FakeProvider
) -> None:
    fake.script = Script(["Fine."])
    fake.fail("gpt-4o-mini", 503, 429)
    retry = {"maxAttempts": 3, "backoffMs": 20, "retryableClasses": ["llm"]}
    run = await drive(store, helper("gpt-4o-mini", retry=retry), "hi", [])
    assert run.status == "succeeded", run.error
    assert fake.keys() == [idempotency_key(run.id, "llm:1", a) for a in (1, 2, 3)]
    events = await store.events(run.id)
    retrying = [e for e in events if e.kind == "step_retrying"]
    assert [e.data["attempt"] for e in retrying] == [2, 3]
    assert all(e.data["delayMs"] >= 10 for e in retrying)
    starts = [e.attempt for e in events if e.kind == "step_started" and e.step_id == "llm:1"]
    assert starts == [1, 2, 3]
    assert run.usage.model_calls == 1


async def test_with_max_attempts_1_a_failed_turn_fails_the_run(
    store: Store, fake: FakeProvider
) -> None:
    fake.fail("gpt-4o-mini", 503)
    run = await drive(store, helper("gpt-4o-mini", retry={"maxAttempts": 1}), "hi", [])
    assert run.status == "failed" and run.error["step"] == "llm:1"
    assert run.error["retryable"] is True and "503" in run.error["message"]


async def test_without_a_policy_a_transient_failure_is_retried_after_a_backoff(
    store: Store, fake: FakeProvider
) -> None:
    fake.script = Script(["Fine."])
    fake.fail("gpt-4o-mini", 503)
    run = await drive(store, helper("gpt-4o-mini"), "hi", [])
    assert run.status == "succeeded", run.error
    retrying = [e for e in await store.events(run.id) if e.kind == "step_retrying"]
    assert [(e.data["attempt"], e.data["of"]) for e in retrying] == [(2, 3)]
    assert (
        250 <= retrying[0].data["delayMs"] <= 500 and "503" in retrying[0].data["error"]["message"]
    )


async def test_the_same_tool_call_over_and_over_is_a_runaway_loop(
    store: Store, fake: FakeProvider
) -> None:
    fake.script = Script([[("crm_lookup", {"id": "c-1"})]])  # every turn: the same call
    calls: list[str] = []
    definition = helper("gpt-4o-mini", anomalies={"runaway_loop": {"repeats": 3, "policy": "fail"}})
    run = await drive(store, definition, "Who is c-1?", calls)
    assert run.status == "failed"
    assert run.error["code"] == "anomaly_detected" and run.error["kind"] == "runaway_loop"
    assert len(calls) == 3  # the fourth identical call never started
    found = [e.data for e in await store.events(run.id) if e.kind == "anomaly_detected"]
    assert [f["kind"] for f in found] == ["runaway_loop"]
    assert found[0]["detail"]["started"] == 4


async def test_a_normal_plain_agent_raises_no_anomaly(store: Store, fake: FakeProvider) -> None:
    fake.script = Script([[("crm_lookup", {"id": "c-1"})], "Ada."])
    run = await drive(store, helper("gpt-4o-mini"), "Who is c-1?", [])
    assert run.status == "succeeded"
    assert not [e for e in await store.events(run.id) if e.kind == "anomaly_detected"]


async def test_timeout_ms_limits_a_tool_call_and_the_model_hears_of_it(
    store: Store, fake: FakeProvider, models: Models
) -> None:
    fake.script = Script([[("slow", {})], "It timed out."])
    a = lantern.App()

    @a.tool("slow")
    async def slow() -> str:
        await asyncio.sleep(30)
        return "too late"

    models.provider("gpt-4o-mini")  # the SDK's import is not the turn's time
    definition = {"name": "hasty", "model": "gpt-4o-mini", "tools": ["slow"], "timeoutMs": 2000}
    await apply_agent(store, definition)
    run = await create_run(store, "hasty", "Go")
    async with Worker(store, a, worker_id="w1", lease_ttl=60, models=models) as w:
        assert w.runner is not None
        async with asyncio.timeout(20):
            await w.runner.drive(run.id)
    done = await store.get_run(run.id)
    assert done is not None and done.status == "succeeded", done and done.error
    answer = {e.step_id: e.data.get("output") for e in await store.events(run.id)}
    assert answer["tool:1:slow"] == {"error": "tool 'slow' timed out after 2000 ms"}


async def test_timeout_ms_fails_a_model_turn_that_runs_past_it(
    store: Store, fake: FakeProvider
) -> None:
    fake.script = Script(["never seen"])
    fake.hold()
    try:
        definition = {"name": "hasty", "model": "gpt-4o-mini", "timeoutMs": 300}
        run = await drive(store, definition, "Go", [])
    finally:
        fake.release()
    assert run.status == "failed"
    assert run.error["code"] == "step_failed" and run.error["step"] == "llm:1"
    assert run.error["class"] == "timeout" and "timed out after 300 ms" in run.error["message"]
