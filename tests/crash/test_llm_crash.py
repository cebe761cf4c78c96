"""SIGKILL a real `lantern serve` around model calls, against the fake provider over HTTP
through the real SDKs: a completed turn is never paid for twice, a turn in flight is sent
again once with the same Idempotency-Key."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.ids import idempotency_key
from lantern.models import router
from lantern.store import Event, Run, Store
from tests.crash.processes import Serve
from tests.crash.test_sigkill import wait_for_status
from tests.fake_llm import FakeProvider, Script, Turn

PROVIDERS = ["gpt-4o-mini", "claude-haiku-4-5"]


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    provider = FakeProvider(script=Script(["Hello, Ada."])).start()
    yield provider
    provider.close()


def drafting(name: str, model: str, **extra: Any) -> dict[str, Any]:
    """trigger -> draft (ai-step) -> seen (tool noop with the draft's text and model)."""
    return {
        "name": name,
        **extra,
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {
                    "id": "draft",
                    "type": "ai-step",
                    "data": {"model": model, "prompt": "Welcome {{ input.name }}"},
                },
                {
                    "id": "seen",
                    "type": "tool",
                    "data": {
                        "tool": "noop",
                        "args": {
                            "text": "{{ steps.draft.output.text }}",
                            "model": "{{ steps.draft.output.model }}",
                        },
                    },
                },
            ],
            "edges": [
                {"source": "start", "target": "draft"},
                {"source": "draft", "target": "seen"},
            ],
        },
    }


def serve(store: Store, tmp_path: Path, fake: FakeProvider, **env: str) -> Serve:
    return Serve(store.url, tmp_path / "serve.log", LANTERN_WORKER_ID="w1", **fake.env(), **env)


async def crash_at(
    store: Store, tmp_path: Path, fake: FakeProvider, point: str, **env: str
) -> None:
    """Run a server that SIGKILLs itself right after the commit ``point`` (kind:step)."""
    crashing = serve(store, tmp_path, fake, LANTERN_TEST_CRASH_AFTER=point, **env)
    code = await asyncio.to_thread(crashing.proc.wait, 60)
    crashing.out.close()
    assert code == -9, crashing.output()


async def finish(
    store: Store,
    tmp_path: Path,
    fake: FakeProvider,
    run_id: str,
    status: str = "succeeded",
    **env: str,
) -> None:
    second = serve(store, tmp_path, fake, **env)
    try:
        await wait_for_status(store, run_id, status, timeout=60)
    finally:
        second.stop()


def completed(events: list[Event]) -> list[tuple[str | None, Any]]:
    return [(e.step_id, e.data.get("output")) for e in events if e.kind == "step_completed"]


@pytest.mark.parametrize("model", PROVIDERS)
async def test_killed_after_a_model_turn_completed_the_provider_is_not_called_again(
    store: Store, tmp_path: Path, fake: FakeProvider, model: str
) -> None:
    await apply_agent(store, drafting("draft", model))
    run = await create_run(store, "draft", {"name": "Ada"})
    await crash_at(store, tmp_path, fake, "step_completed:draft")
    assert len(fake.calls()) == 1
    before = await store.get_run(run.id)
    assert before is not None and before.usage.model_calls == 1

    await finish(store, tmp_path, fake, run.id)
    assert len(fake.calls()) == 1  # the journal served the turn: no second call, no new tokens
    after = await store.get_run(run.id)
    assert after is not None
    assert after.output == {"text": "Hello, Ada.", "model": model}
    assert after.usage == before.usage
    recovered = [e for e in await store.events(run.id) if e.kind == "run_recovered"]
    assert "draft" in recovered[0].data["replayed"]


@pytest.mark.parametrize("model", PROVIDERS)
async def test_killed_while_a_model_call_is_in_flight_it_is_repeated_once_with_the_same_key(
    store: Store, tmp_path: Path, fake: FakeProvider, model: str
) -> None:
    await apply_agent(store, drafting("draft", model))
    run = await create_run(store, "draft", {"name": "Ada"})
    fake.hold()
    first = serve(store, tmp_path, fake)
    assert await asyncio.to_thread(fake.arrived.wait, 60), first.output()
    first.kill()  # the model call is unanswered
    fake.release()

    await finish(store, tmp_path, fake, run.id)
    calls = fake.calls()
    assert len(calls) == 2
    assert {c.key for c in calls} == {idempotency_key(run.id, "draft", 1)}
    assert calls[0].body == calls[1].body  # the same request, sent again
    events = await store.events(run.id)
    assert [s for s, _ in completed(events)].count("draft") == 1
    stored = await store.get_run(run.id)
    assert stored is not None and stored.usage.model_calls == 1


# ----------------------------------------------------------------------------- plain agents

HELPER_TURNS: list[Turn] = [
    [("crm_lookup", {"id": "c-42"})],
    [("orders_list", {"customer": "c-42", "limit": 5})],
    "Ada has orders 1 and 2.",
]
POINTS = [
    "step_completed:llm:1",
    "step_completed:tool:1:crm.lookup",
    "step_completed:llm:2",
    "step_completed:tool:2:orders.list",
]


def helper(model: str) -> dict[str, Any]:
    return {
        "name": "helper",
        "model": model,
        "system": "You help with customers.",
        "tools": ["crm.lookup", "orders.list"],
    }


async def reference_run(
    store: Store, fake: FakeProvider, monkeypatch: pytest.MonkeyPatch, message: str
) -> Run:
    """The same agent run uncrashed, in this process (the crash app's tools, the fake's SDK
    settings)."""
    from tests.crash.crash_app import app

    for name, value in fake.env().items():
        monkeypatch.setenv(name, value)
    run = await create_run(store, "helper", message)
    async with Worker(store, app, worker_id="reference", lease_ttl=60) as w:
        assert w.runner is not None
        done = await w.runner.drive(run.id)
    assert done is not None
    stored = await store.get_run(run.id)  # with the usage the database summed
    assert stored is not None
    return stored


async def test_a_plain_agent_killed_at_each_point_finishes_with_the_same_transcript(
    store: Store, tmp_path: Path, fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (Anthropic's tool format is exercised in-process: tests/models/test_plain_agents.py.)
    model = PROVIDERS[0]
    fake.script = Script(HELPER_TURNS)
    message = "What has customer c-42 ordered?"
    await apply_agent(store, helper(model))
    ref = await reference_run(store, fake, monkeypatch, message)
    expected = completed(await store.events(ref.id))
    assert [s for s, _ in expected] == [
        "llm:1",
        "tool:1:crm.lookup",
        "llm:2",
        "tool:2:orders.list",
        "llm:3",
    ]
    assert ref.output["text"] == "Ada has orders 1 and 2."
    assert ref.usage.model_calls == 3
    fake.requests.clear()
    # One run per point, each killed there by its own server; the next server re-drives the
    # earlier runs too (and may cut them off again: any crash must leave the transcript whole).
    runs = []
    for point in POINTS:
        run = await create_run(store, "helper", message)
        runs.append(run.id)
        await crash_at(store, tmp_path, fake, point, LANTERN_TEST_CRASH_RUN=run.id)
        # The turns completed by the kill were each sent once.
        turn = int(point.split(":")[2]) if point.startswith("step_completed:llm") else None
        for k in range(1, (turn or int(point.split(":")[2])) + 1):
            assert fake.keys().count(idempotency_key(run.id, f"llm:{k}", 1)) == 1, point
    last = serve(store, tmp_path, fake)
    try:
        for run_id in runs:
            await wait_for_status(store, run_id, "succeeded", timeout=60)
    finally:
        last.stop()
    for run_id in runs:
        events = await store.events(run_id)
        assert completed(events) == [(s, _same_run(o, ref.id, run_id)) for s, o in expected]
        stored = await store.get_run(run_id)
        assert stored is not None
        assert (stored.output, stored.usage) == (ref.output, ref.usage)
        keys = fake.keys()
        for k in (1, 2, 3):  # sent once, or again (same key) if a kill caught it in flight
            assert 1 <= keys.count(idempotency_key(run_id, f"llm:{k}", 1)) <= 2


def _same_run(output: Any, old: str, new: str) -> Any:
    return json.loads(json.dumps(output).replace(old, new))


async def test_a_plain_agent_model_turn_in_flight_is_sent_again_with_its_key(
    store: Store, tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script = Script(HELPER_TURNS)
    await apply_agent(store, helper("gpt-4o-mini"))
    run = await create_run(store, "helper", {"message": "What has customer c-42 ordered?"})
    fake.hold(after=1)  # llm:1 is answered, llm:2 stays in flight
    first = serve(store, tmp_path, fake)
    assert await asyncio.to_thread(fake.arrived.wait, 60), first.output()
    first.kill()
    fake.release()
    await finish(store, tmp_path, fake, run.id)
    keys = [c.key for c in fake.calls()]
    assert keys == [
        idempotency_key(run.id, "llm:1", 1),
        idempotency_key(run.id, "llm:2", 1),
        idempotency_key(run.id, "llm:2", 1),
        idempotency_key(run.id, "llm:3", 1),
    ]
    # The model saw the tool's answer, in its native format.
    tool_message = fake.calls()[1].body["messages"][-1]
    assert tool_message["role"] == "tool"
    assert json.loads(tool_message["content"]) == {"id": "c-42", "name": "Ada"}


# ------------------------------------------------------------------------- budget and router


async def test_budget_gate_after_a_crash_counts_what_was_spent_before_it(
    store: Store, tmp_path: Path, fake: FakeProvider
) -> None:
    # gpt-4o: $2.50/M in, $10/M out. draft costs 10 in + 5 out = $0.000075; the second step's
    # estimate (its prompt, plus maxTokens 100 of output) takes the run past $0.00015.
    definition = drafting("budgeted", "gpt-4o", budget={"maxUsd": 0.00015})
    definition["graph"]["nodes"][2] = {
        "id": "seen",
        "type": "ai-step",
        "data": {"model": "gpt-4o", "prompt": "{{ steps.draft.output.text }}", "maxTokens": 100},
    }
    await apply_agent(store, definition)
    run = await create_run(store, "budgeted", {"name": "Ada"})
    await crash_at(store, tmp_path, fake, "step_completed:draft")
    before = await store.get_run(run.id)
    assert before is not None and before.usage.cost_usd == pytest.approx(0.000075)

    await finish(store, tmp_path, fake, run.id, status="failed")
    after = await store.get_run(run.id)
    assert after is not None
    assert after.usage == before.usage
    assert after.error["code"] == "budget_exceeded"
    assert after.error["step"] == "seen"
    assert "maxUsd $0.00015" in after.error["message"]
    assert [c.model for c in fake.calls()] == ["gpt-4o"]  # the provider never saw the call


async def test_router_falls_back_on_503_and_a_replay_uses_the_journaled_choice(
    store: Store, tmp_path: Path, fake: FakeProvider
) -> None:
    routes = json.dumps({"cheap-then-strong": ["gpt-4o-mini", "claude-haiku-4-5"]})
    known = router.configured(routes, None)  # validation knows the route
    await apply_agent(store, drafting("routed", "route:cheap-then-strong"), routes=known)
    fake.fail("gpt-4o-mini", 503)
    run = await create_run(store, "routed", {"name": "Ada"})
    await crash_at(store, tmp_path, fake, "step_completed:draft", LANTERN_MODEL_ROUTES=routes)
    assert [(c.model, c.path) for c in fake.calls()] == [
        ("gpt-4o-mini", "/v1/chat/completions"),
        ("claude-haiku-4-5", "/v1/messages"),
    ]
    await finish(store, tmp_path, fake, run.id, LANTERN_MODEL_ROUTES=routes)
    assert len(fake.calls()) == 2  # no re-routing: gpt-4o-mini would answer now
    events = await store.events(run.id)
    draft = dict(completed(events))["draft"]
    assert draft["model"] == "claude-haiku-4-5" and draft["provider"] == "anthropic"
    assert draft["route"]["name"] == "cheap-then-strong"
    assert [t["model"] for t in draft["route"]["tried"]] == ["gpt-4o-mini"]
    assert "503" in draft["route"]["tried"][0]["error"]
    stored = await store.get_run(run.id)
    assert stored is not None and stored.output["model"] == "claude-haiku-4-5"


async def test_a_plain_agent_killed_in_a_retry_backoff_retries_with_the_next_key(
    store: Store, tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script = Script(["Fine."])
    fake.fail("gpt-4o-mini", 503)
    retry = {"maxAttempts": 2, "backoffMs": 1000, "retryableClasses": ["llm"]}
    await apply_agent(store, {**helper("gpt-4o-mini"), "retry": retry})
    run = await create_run(store, "helper", "hi")
    await crash_at(store, tmp_path, fake, "step_retrying:llm:1")
    await finish(store, tmp_path, fake, run.id)
    assert fake.keys() == [idempotency_key(run.id, "llm:1", 1), idempotency_key(run.id, "llm:1", 2)]
    events = await store.events(run.id)
    starts = [e.attempt for e in events if e.kind == "step_started" and e.step_id == "llm:1"]
    assert starts == [1, 2]
    (retrying,) = [e for e in events if e.kind == "step_retrying"]
    (second,) = [e for e in events if e.kind == "step_started" and e.attempt == 2]
    assert second.at.timestamp() * 1000 >= retrying.data["dueAt"] - 1  # the backoff held
