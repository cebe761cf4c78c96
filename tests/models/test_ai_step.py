"""ai-step nodes in-process on both backends, against the offline provider and the fake
provider over real HTTP through the real SDKs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import lantern
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.errors import DefinitionError
from lantern.ids import idempotency_key
from lantern.store import Store
from tests.fake_llm import FakeProvider, Script


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProvider]:
    provider = FakeProvider(script=Script(["Hello, Ada."])).start()
    for name, value in provider.env().items():
        monkeypatch.setenv(name, value)
    yield provider
    provider.close()


def agent(name: str, **data: Any) -> dict[str, Any]:
    step = {"model": "offline/echo", "prompt": "Welcome {{ input.name }}", **data}
    return {
        "name": name,
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "draft", "type": "ai-step", "data": step},
                {
                    "id": "after",
                    "type": "tool",
                    "data": {
                        "tool": "see",
                        "args": {
                            "text": "{{ steps.draft.output.text }}",
                            "model": "{{ steps.draft.output.model }}",
                        },
                    },
                },
            ],
            "edges": [
                {"source": "start", "target": "draft"},
                {"source": "draft", "target": "after"},
            ],
        },
    }


def app() -> lantern.App:
    a = lantern.App()

    @a.tool("see")
    async def see(text: str, model: str) -> dict[str, str]:
        return {"saw": text, "model": model}

    return a


async def drive(store: Store, definition: dict[str, Any], input: Any) -> Any:
    await apply_agent(store, definition)
    run = await create_run(store, definition["name"], input)
    async with Worker(store, app(), worker_id="w1", lease_ttl=60) as w:
        assert w.runner is not None
        return await w.runner.drive(run.id)


async def test_offline_ai_step_needs_no_key_and_is_labeled_offline(store: Store) -> None:
    run = await drive(store, agent("offline-draft"), {"name": "Ada"})
    assert run.status == "succeeded", run.error
    assert run.output == {"saw": "Welcome Ada", "model": "offline/echo"}
    events = await store.events(run.id)
    (draft,) = [e for e in events if e.kind == "step_completed" and e.step_id == "draft"]
    out = draft.data["output"]
    assert out["provider"] == "offline" and out["text"] == "Welcome Ada"
    assert out["usage"]["costUsd"] == 0.0 and out["usage"]["outputTokens"] == 3
    stored = await store.get_run(run.id)
    assert stored is not None
    assert stored.usage.model_calls == 1
    assert stored.usage.output_tokens == 3


@pytest.mark.parametrize(
    "model,path", [("gpt-4o-mini", "/v1/chat/completions"), ("claude-haiku-4-5", "/v1/messages")]
)
async def test_provider_call_carries_the_step_key_and_is_priced(
    store: Store, fake: FakeProvider, model: str, path: str
) -> None:
    run = await drive(
        store, agent(f"draft-{model[:3]}", model=model, system="Be short."), {"name": "Ada"}
    )
    assert run.status == "succeeded", run.error
    assert run.output["saw"] == "Hello, Ada."
    (request,) = fake.calls()
    assert request.path == path
    assert request.key == idempotency_key(run.id, "draft", 1)
    assert request.model == model
    assert "traceparent" not in request.headers or request.headers["traceparent"]
    stored = await store.get_run(run.id)
    assert stored is not None
    # 2 messages on OpenAI (system + user) or 1 on Anthropic (system apart), 10 tokens each
    expected_in = 20 if path.endswith("completions") else 10
    assert (stored.usage.input_tokens, stored.usage.output_tokens) == (expected_in, 5)
    assert stored.usage.cost_usd > 0


async def test_json_response_format(store: Store) -> None:
    run = await drive(
        store, agent("json-draft", prompt='{"a": {{ input.n }}}', responseFormat="json"), {"n": 2}
    )
    assert run.status == "succeeded", run.error
    events = await store.events(run.id)
    (draft,) = [e for e in events if e.kind == "step_completed" and e.step_id == "draft"]
    assert draft.data["output"]["json"] == {"a": 2}


async def test_invalid_json_fails_the_step(store: Store, fake: FakeProvider) -> None:
    run = await drive(
        store, agent("bad-json", model="gpt-4o-mini", responseFormat="json"), {"name": "x"}
    )
    assert run.status == "failed"
    assert run.error["step"] == "draft" and "did not answer JSON" in run.error["message"]
    assert fake.calls()[0].body["response_format"] == {"type": "json_object"}


async def test_a_4xx_is_not_retryable_and_keeps_the_provider_message(
    store: Store, fake: FakeProvider
) -> None:
    fake.fail("gpt-4o-mini", 400)
    run = await drive(store, agent("bad-request", model="gpt-4o-mini"), {"name": "x"})
    assert run.status == "failed"
    assert run.error["class"] == "llm" and run.error["retryable"] is False
    assert "400" in run.error["message"] and "fake 400" in run.error["message"]


def test_unknown_models_and_routes_fail_validation() -> None:
    from lantern.config import ModelSettings
    from lantern.engine.graph import parse_agent
    from lantern.models.registry import Models

    env = {"LANTERN_MODEL_ROUTES": '{"cheap": ["gpt-4o-mini", "claude-haiku-4-5"]}'}
    routes = Models.from_settings(ModelSettings.from_env(env)).routes
    parse_agent(agent("ok", model="route:cheap"), routes)
    with pytest.raises(DefinitionError) as info:
        parse_agent(agent("bad", model="route:nope", temperature=5, maxTokens=0), routes)
    text = str(info.value)
    assert "unknown model route 'nope'" in text and "cheap" in text
    assert "temperature must be from 0 to 2" in text and "maxTokens must be a positive" in text
    with pytest.raises(DefinitionError, match="unknown offline model 'offline/nope'"):
        parse_agent(agent("bad", model="offline/nope"))


async def test_a_retried_model_call_carries_its_attempts_key(
    store: Store, fake: FakeProvider
) -> None:
    retry = {"maxAttempts": 2, "backoffMs": 0, "retryableClasses": ["llm"]}
    fake.fail("gpt-4o-mini", 503)
    run = await drive(store, agent("retried", model="gpt-4o-mini", retry=retry), {"name": "Ada"})
    assert run.status == "succeeded", run.error
    assert fake.keys() == [idempotency_key(run.id, "draft", 1), idempotency_key(run.id, "draft", 2)]
    events = await store.events(run.id)
    (retrying,) = [e for e in events if e.kind == "step_retrying"]
    assert retrying.data["attempt"] == 2 and "503" in retrying.data["error"]["message"]
    stored = await store.get_run(run.id)
    assert stored is not None and stored.usage.model_calls == 1  # the 503 cost nothing
