"""Usage on the run (API and CLI), the budget gate in-process, and keys across attempts."""

from __future__ import annotations

from collections.abc import Iterator
from types import MappingProxyType
from typing import Any

import httpx
import pytest

import lantern
from lantern.config import ModelSettings
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.ids import idempotency_key
from lantern.models.registry import Models
from lantern.nodes import StepContext, ai_step
from lantern.nodes.base import Node
from lantern.store import Store
from tests.api.test_cli_remote import lantern as lantern_cli
from tests.fake_llm import FakeProvider, Script
from tests.models.test_ai_step import agent
from tests.server import ALL_SCOPES, Server, make_key


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProvider]:
    provider = FakeProvider(script=Script(["Hello."])).start()
    for name, value in provider.env().items():
        monkeypatch.setenv(name, value)
    yield provider
    provider.close()


def offline_draft(name: str) -> dict[str, Any]:
    d = agent(name)
    d["graph"]["nodes"][2] = {"id": "after", "type": "tool", "data": {"tool": "noop"}}
    return d


def test_usage_on_the_run_over_the_api_and_in_runs_show(api_server: Server) -> None:
    key = make_key(api_server.database_url, "default", ALL_SCOPES)
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=api_server.url, headers=headers, timeout=30) as api:
        api.put("/v1/agents/drafter", json=offline_draft("drafter")).raise_for_status()
        created = api.post("/v1/runs", json={"agentName": "drafter", "input": {"name": "Ada"}})
        run_id = created.json()["id"]
        assert created.json()["usage"]["modelCalls"] == 0
        run = api.get(f"/v1/runs/{run_id}", params={"wait": 20}).json()
    assert run["status"] == "succeeded", run
    # "Welcome Ada": 11 characters, 3 tokens each way on the offline model, which is free
    assert run["usage"] == {"inputTokens": 3, "outputTokens": 3, "costUsd": 0.0, "modelCalls": 1}
    shown = lantern_cli(api_server, key, "runs", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "draft: model offline/echo (offline)" in shown.stdout
    assert "usage: 1 model call(s), 3 input and 3 output tokens" in shown.stdout


async def drive(
    store: Store, definition: dict[str, Any], input: Any, models: Models | None = None
) -> Any:
    app = lantern.App()

    @app.tool("noop")
    async def noop(**kwargs: Any) -> dict[str, Any]:
        return kwargs

    @app.tool("crm.lookup")
    async def lookup(id: str) -> dict[str, str]:
        """Find a customer by id."""
        return {"id": id}

    await apply_agent(store, definition)
    run = await create_run(store, definition["name"], input)
    async with Worker(store, app, worker_id="w1", lease_ttl=60, models=models) as w:
        assert w.runner is not None
        await w.runner.drive(run.id)
    return await store.get_run(run.id)


async def test_a_plain_agent_over_its_token_budget_fails_before_the_call(
    store: Store, fake: FakeProvider
) -> None:
    fake.script = Script([[("crm_lookup", {"id": "c-1"})], "done"])
    definition = {
        "name": "thrifty",
        "model": "gpt-4o-mini",
        "system": "Be brief.",
        "tools": ["crm.lookup"],
        "budget": {"maxTokens": 40},
    }
    run = await drive(store, definition, "Who is c-1?")
    assert run.status == "failed"
    assert run.error["code"] == "budget_exceeded" and run.error["step"] == "llm:2"
    assert "maxTokens 40" in run.error["message"] and "was not made" in run.error["message"]
    assert len(fake.calls()) == 1  # the provider never saw the second turn
    assert run.usage.model_calls == 1 and run.usage.tokens == 25


async def test_a_workspace_budget_counts_the_workspaces_runs(store: Store) -> None:
    env = {"LANTERN_WORKSPACE_BUDGETS": '{"default": {"maxTokens": 10}}'}
    models = Models.from_settings(ModelSettings.from_env(env))
    first = await drive(store, offline_draft("frugal"), {"name": "Ada"}, models)
    second = await drive(store, offline_draft("frugal"), {"name": "Ada"}, models)
    third = await drive(store, offline_draft("frugal"), {"name": "Ada"}, models)
    assert [r.status for r in (first, second, third)] == ["succeeded", "succeeded", "failed"]
    assert third.error["code"] == "budget_exceeded"
    assert "workspace 'default' (this month) has used 12 tokens" in third.error["message"]
    assert third.usage.model_calls == 0


async def test_the_key_is_the_step_attempts_and_differs_across_attempts(
    store: Store, fake: FakeProvider, models: Models
) -> None:
    node = Node("draft", "ai-step", MappingProxyType({"model": "gpt-4o-mini", "prompt": "Hi"}))
    for attempt in (1, 2, 2):
        ctx = StepContext(
            run_id="run_x",
            step_id="draft",
            node=node,
            attempt=attempt,
            idempotency_key=idempotency_key("run_x", "draft", attempt),
            scope={"input": {}},
            app=lantern.App(),
            # An ai-step reads none of http, deliveries and signing_secrets.
            http=None,  # type: ignore[arg-type]
            deliveries=None,  # type: ignore[arg-type]
            signing_secrets=None,  # type: ignore[arg-type]
            models=models,
        )
        assert (await ai_step.execute(ctx))["text"] == "Hello."
    keys = fake.keys()
    assert keys[0] == idempotency_key("run_x", "draft", 1)
    assert keys[1] == keys[2] == idempotency_key("run_x", "draft", 2) != keys[0]


@pytest.mark.parametrize("model", ["gpt-4o-mini", "claude-haiku-4-5"])
async def test_a_provider_request_carries_the_current_trace(
    fake: FakeProvider, model: str, models: Models
) -> None:
    from opentelemetry import trace

    span = trace.NonRecordingSpan(
        trace.SpanContext(
            trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
            span_id=0x00F067AA0BA902B7,
            is_remote=False,
            trace_flags=trace.TraceFlags(1),
        )
    )
    node = Node("draft", "ai-step", MappingProxyType({"model": model, "prompt": "Hi"}))
    ctx = StepContext(
        run_id="run_t",
        step_id="draft",
        node=node,
        attempt=1,
        idempotency_key=idempotency_key("run_t", "draft", 1),
        scope={"input": {}},
        app=lantern.App(),
        # An ai-step reads none of http, deliveries and signing_secrets.
        http=None,  # type: ignore[arg-type]
        deliveries=None,  # type: ignore[arg-type]
        signing_secrets=None,  # type: ignore[arg-type]
        models=models,
    )
    from opentelemetry.sdk.trace import TracerProvider

    from lantern.observability import tracing

    tracing.install(TracerProvider())  # what lantern serve does when OTLP export is set
    try:
        with trace.use_span(span):
            await ai_step.execute(ctx)
    finally:
        tracing.shutdown()
    (request,) = fake.calls()
    assert request.headers["traceparent"] == (
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    )
