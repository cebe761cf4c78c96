"""A Pydantic AI agent made durable with ``lantern.integrations.pydantic_ai.durable``, driven
in-process on both backends: each model request and each tool call is a step of the run, a
crash replays the completed ones from the journal, a tool's ModelRetry stays Pydantic AI's."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import pytest
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import lantern
from lantern.engine.runs import create_run
from lantern.engine.worker import Worker
from lantern.ids import idempotency_key
from lantern.integrations.pydantic_ai import durable
from lantern.store import Store


class Crash(BaseException):
    """Stands for a SIGKILL: nothing in the engine catches it, nothing is cleaned up."""


async def drive(store: Store, app: lantern.App, run_id: str) -> Any:
    async with Worker(store, app, worker_id="w1", lease_ttl=60) as w:
        assert w.runner is not None
        await w.runner.drive(run_id)
    return await store.get_run(run_id)


class Weather:
    """A two-turn conversation: the model asks for ``lookup``, then answers with its result.
    Each model request and tool call is counted, with the Lantern step key it ran under."""

    def __init__(self, crash_on_turn: int | None = None) -> None:
        self.turns: list[tuple[int, str]] = []
        self.lookups: list[str] = []
        self.crash_on_turn = crash_on_turn
        self.ctx: lantern.Context | None = None
        self.agent = Agent(FunctionModel(self.model), name="weather")
        self.agent.tool_plain(self.lookup)

    def model(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages) + 1
        assert self.ctx is not None
        self.turns.append((turn, self.ctx.idempotency_key))
        if turn == self.crash_on_turn:
            self.crash_on_turn = None
            raise Crash()
        if turn == 1:
            return ModelResponse(parts=[ToolCallPart("lookup", {"city": "Oslo"})])
        answer = messages[-1].parts[0]
        assert isinstance(answer, ToolReturnPart) and isinstance(answer.content, dict)
        looked: Mapping[str, object] = answer.content  # what lookup returned
        return ModelResponse(parts=[TextPart(f"It is {looked['temp']} C")])

    def lookup(self, city: str) -> dict[str, Any]:
        """The temperature in a city."""
        assert self.ctx is not None
        self.lookups.append(self.ctx.idempotency_key)
        return {"city": city, "temp": -3}

    def app(self) -> lantern.App:
        app = lantern.App()

        @app.agent("forecast")
        async def forecast(ctx: lantern.Context, city: str) -> str:
            self.ctx = ctx
            result = await durable(self.agent).run(ctx, f"Weather in {city}?")
            return result.output

        return app


async def completed(store: Store, run_id: str) -> list[tuple[str | None, Any]]:
    return [
        (e.step_id, e.data["output"])
        for e in await store.events(run_id)
        if e.kind == "step_completed"
    ]


async def test_each_model_request_and_tool_call_is_a_step_in_the_journal(store: Store) -> None:
    weather = Weather()
    app = weather.app()
    run = await create_run(store, "forecast", {"city": "Oslo"}, app=app)
    done = await drive(store, app, run.id)
    assert done.status == "succeeded", done.error
    assert done.output == "It is -3 C"
    steps = await completed(store, run.id)
    assert [s for s, _ in steps] == ["weather.model", "weather.tool.lookup", "weather.model#2"]
    first, tool, second = (out for _, out in steps)
    # A model response is journaled as Pydantic AI's own JSON form of it.
    assert first["kind"] == "response"
    assert [(p["part_kind"], p["tool_name"], p["args"]) for p in first["parts"]] == [
        ("tool-call", "lookup", {"city": "Oslo"})
    ]
    assert tool == {"return": {"city": "Oslo", "temp": -3}}
    assert [p["content"] for p in second["parts"]] == ["It is -3 C"]
    # Each ran once, under its own step's idempotency key.
    assert weather.turns == [
        (1, idempotency_key(run.id, "weather.model", 1)),
        (2, idempotency_key(run.id, "weather.model#2", 1)),
    ]
    assert weather.lookups == [idempotency_key(run.id, "weather.tool.lookup", 1)]


async def test_a_crash_in_the_second_turn_replays_the_first_turn_and_the_tool(
    store: Store,
) -> None:
    weather = Weather(crash_on_turn=2)
    app = weather.app()
    run = await create_run(store, "forecast", {"city": "Oslo"}, app=app)
    with pytest.raises(Crash):
        await drive(store, app, run.id)
    done = await drive(store, app, run.id)
    assert done.status == "succeeded", done.error
    assert done.output == "It is -3 C"
    # Turn 1 and the lookup came from the journal; turn 2, in flight, ran again with its key.
    key2 = idempotency_key(run.id, "weather.model#2", 1)
    assert weather.turns == [(1, idempotency_key(run.id, "weather.model", 1)), (2, key2), (2, key2)]
    assert len(weather.lookups) == 1
    steps = [s for s, _ in await completed(store, run.id)]
    assert steps == ["weather.model", "weather.tool.lookup", "weather.model#2"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_tools_model_retry_is_journaled_and_stays_pydantic_ais(store: Store) -> None:
    tries: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages) + 1
        if turn <= 2:
            return ModelResponse(parts=[ToolCallPart("pick", {"n": turn})])
        return ModelResponse(parts=[TextPart("picked")])

    agent = Agent(FunctionModel(model), name="picker")

    @agent.tool_plain
    def pick(n: int) -> str:
        tries.append(f"n={n}")
        if n == 1:
            raise ModelRetry("pick a bigger number")
        return "ok"

    app = lantern.App()

    @app.agent("pick")
    async def run_pick(ctx: lantern.Context) -> str:
        return (await durable(agent).run(ctx, "pick one")).output

    run = await create_run(store, "pick", None, app=app)
    done = await drive(store, app, run.id)
    assert done.status == "succeeded", done.error
    assert done.output == "picked" and tries == ["n=1", "n=2"]
    steps = dict(await completed(store, run.id))
    assert steps["picker.tool.pick"] == {"modelRetry": "pick a bigger number"}
    assert steps["picker.tool.pick#2"] == {"return": "ok"}
    failed = [e for e in await store.events(run.id) if e.kind == "step_failed"]
    assert failed == []


def test_lantern_itself_does_not_import_pydantic_ai() -> None:
    """The integration is an optional extra: importing Lantern (its server, engine and CLI
    included) must work without Pydantic AI installed, so it must not import it."""
    code = (
        "import sys, lantern, lantern.cli.main, lantern.server.app, lantern.engine.worker\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic_ai')\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_transient_model_error_is_retried_and_a_bad_request_is_not(store: Store) -> None:
    statuses = {"flaky": [503], "refused": [400, 400, 400]}
    seen: dict[str, int] = {"flaky": 0, "refused": 0}

    def model_of(name: str) -> FunctionModel:
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            seen[name] += 1
            if statuses[name]:
                raise ModelHTTPError(statuses[name].pop(0), "function", {"error": "no"})
            return ModelResponse(parts=[TextPart("fine")])

        return FunctionModel(model)

    app = lantern.App()

    def register(name: str) -> None:
        agent = Agent(model_of(name), name=name)

        @app.agent(name)
        async def run_it(ctx: lantern.Context) -> str:
            return (await durable(agent).run(ctx, "hi")).output

    for name in statuses:
        register(name)

    flaky = await create_run(store, "flaky", None, app=app)
    done = await drive(store, app, flaky.id)
    assert done.status == "succeeded", done.error
    assert done.output == "fine" and seen["flaky"] == 2
    (retry,) = [e for e in await store.events(flaky.id) if e.kind == "step_retrying"]
    assert retry.step_id == "flaky.model" and retry.data["error"]["class"] == "llm"

    refused = await create_run(store, "refused", None, app=app)
    done = await drive(store, app, refused.id)
    assert done.status == "failed" and seen["refused"] == 1  # a 400 is not tried again
    (failed,) = [e for e in await store.events(refused.id) if e.kind == "step_failed"]
    error = failed.data["error"]
    assert (error["class"], error["retryable"]) == ("llm", False), error
    assert "status_code: 400" in error["message"]
