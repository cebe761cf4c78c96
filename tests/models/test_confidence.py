"""The confidence gate of an ai-step, against the fake provider through the real SDK."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import lantern
from lantern.engine.approvals import decide
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.store import Store
from tests.fake_llm import FakeProvider, Script
from tests.integration.test_run_control import until

RATE = "Rate how likely"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProvider]:
    provider = FakeProvider(script=Script(["Dear Ada, welcome."])).start()
    for name, value in provider.env().items():
        monkeypatch.setenv(name, value)
    yield provider
    provider.close()


def app() -> lantern.App:
    a = lantern.App()

    @a.tool("send")
    async def send(text: str) -> dict[str, str]:
        return {"sent": text}

    @a.tool("strict_judge")
    async def strict_judge(prompt: str, output: dict[str, Any]) -> dict[str, float]:
        return {"score": 0.1 if "welcome" in output["text"] else 0.9}

    return a


def gated(name: str, **confidence: Any) -> dict[str, Any]:
    return {
        "name": name,
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {
                    "id": "draft",
                    "type": "ai-step",
                    "data": {
                        "model": "gpt-4o-mini",
                        "prompt": "Welcome {{ input.name }}",
                        "confidence": confidence,
                    },
                },
                {
                    "id": "mail",
                    "type": "tool",
                    "data": {"tool": "send", "args": {"text": "{{ steps.draft.output.text }}"}},
                },
            ],
            "edges": [
                {"source": "start", "target": "draft"},
                {"source": "draft", "target": "mail"},
            ],
        },
    }


@pytest.fixture
async def worker(store: Store) -> AsyncIterator[Worker]:
    async with Worker(store, app(), worker_id="w1", lease_ttl=60, poll_interval=0.05) as w:
        task = asyncio.create_task(w.serve())
        yield w
        await w.stop(grace=1)
        await task


async def start(store: Store, definition: dict[str, Any]) -> str:
    await apply_agent(store, definition)
    return (await create_run(store, definition["name"], {"name": "Ada"})).id


async def kinds(store: Store, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [dict(e.data) for e in await store.events(run_id) if e.kind == kind]


async def test_a_high_self_rating_passes_in_a_second_keyed_call(
    store: Store, fake: FakeProvider, worker: Worker
) -> None:
    fake.replies[RATE] = "0.93"
    run_id = await start(store, gated("sure", threshold=0.8))
    run = await until(store, run_id, "succeeded", "failed", "waiting")
    assert run.status == "succeeded", run.error
    assert run.output == {"sent": "Dear Ada, welcome."}
    [evaluated] = await kinds(store, run_id, "confidence_evaluated")
    assert evaluated["score"] == 0.93 and evaluated["decision"] == "pass"
    assert evaluated["threshold"] == 0.8 and evaluated["evaluator"] == "self"
    keys = fake.keys()
    assert len(keys) == 2 and len(set(keys)) == 2  # the rating has a key of its own
    assert RATE in fake.requests[1].body["messages"][-1]["content"]
    assert run.usage.model_calls == 2


async def test_a_low_score_parks_the_run_until_someone_approves_the_answer(
    store: Store, fake: FakeProvider, worker: Worker
) -> None:
    fake.replies[RATE] = "0.2"
    run_id = await start(store, gated("unsure", threshold=0.8))
    parked = await until(store, run_id, "waiting", "succeeded", "failed")
    assert parked.status == "waiting"
    [evaluated] = await kinds(store, run_id, "confidence_evaluated")
    assert evaluated["decision"] == "review"
    [waiting] = await kinds(store, run_id, "step_waiting")
    assert waiting["gate"] == "confidence" and "0.20 is below 0.80" in waiting["prompt"]
    assert await kinds(store, run_id, "step_completed") == [await _trigger(store, run_id)]
    await decide(store, parked, "draft", "approved", "key:editor")
    done = await until(store, run_id, "succeeded", "failed")
    assert done.status == "succeeded", done.error
    assert done.output == {"sent": "Dear Ada, welcome."}  # the held-back answer went on


async def test_rejecting_a_low_confidence_answer_fails_the_step(
    store: Store, fake: FakeProvider, worker: Worker
) -> None:
    fake.replies[RATE] = "not sure at all"  # no number: scores 0
    run_id = await start(store, gated("doubtful", threshold=0.5))
    parked = await until(store, run_id, "waiting")
    await decide(store, parked, "draft", "rejected", "key:editor", "off tone")
    done = await until(store, run_id, "failed")
    assert done.error["step"] == "draft" and "off tone" in done.error["message"]


async def test_a_tool_evaluator_scores_the_answer(
    store: Store, fake: FakeProvider, worker: Worker
) -> None:
    run_id = await start(store, gated("judged", threshold=0.5, evaluator="tool:strict_judge"))
    await until(store, run_id, "waiting")
    [evaluated] = await kinds(store, run_id, "confidence_evaluated")
    assert (evaluated["score"], evaluated["evaluator"]) == (0.1, "tool:strict_judge")
    assert len(fake.requests) == 1  # no rating call


async def test_no_handler_wired_bypasses_the_gate_and_the_step_passes(
    store: Store, fake: FakeProvider, worker: Worker
) -> None:
    run_id = await start(store, gated("unwired", threshold=0.99, evaluator="tool:nobody"))
    run = await until(store, run_id, "succeeded", "failed", "waiting")
    assert run.status == "succeeded"
    [bypassed] = await kinds(store, run_id, "confidence_gate_bypassed")
    assert bypassed["evaluator"] == "tool:nobody" and "nobody" in bypassed["reason"]
    assert await kinds(store, run_id, "confidence_evaluated") == []


async def _trigger(store: Store, run_id: str) -> dict[str, Any]:
    return next(dict(e.data) for e in await store.events(run_id) if e.kind == "step_completed")
