"""OpenAI Agents SDK agents made durable inside a code-first agent (docs/integrations.md), the
optional extra ``lantern[openai-agents]``.

``await durable(agent).run(ctx, input)`` runs ``Runner.run`` with two wrappers for that run:
the run's model provider (``RunConfig.model_provider``, the SDK's hook that every model
lookup goes through) hands out models whose ``get_response`` is a Lantern step
(``<name>.model``), and every function tool of the agent and of the agents it hands off to is
a copy whose ``on_invoke_tool`` is a step (``<name>.tool.<tool>``). Both go through
``ctx.step``, so each is journaled with its idempotency key and, after a crash, returns its
journaled value without being run again: a completed model response is not paid for twice, a
completed tool call is not repeated; the one step in flight at the crash runs again with the
same key, which every model request carries as its ``Idempotency-Key`` header.

A handoff is the model's own tool call, answered by the SDK from the journaled response, so
the agents a run hands off to stay inside the one Lantern run. The user's agents are not
changed: the run works on copies (handoffs that are ``Agent`` objects are copied too; a
custom ``Handoff`` object is used as given, and its agent's tools are not steps).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from lantern.context import Context
from lantern.errors import StepError, UsageError

try:
    from agents import Agent, FunctionTool, RunConfig, Runner, RunResult
    from agents.items import ModelResponse, TResponseOutputItem
    from agents.model_settings import ModelSettings
    from agents.models.interface import Model, ModelProvider
    from agents.models.multi_provider import MultiProvider
    from agents.tool_context import ToolContext
    from agents.usage import Usage
    from openai import APIConnectionError, APIStatusError
    from pydantic import TypeAdapter
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "lantern.integrations.openai_agents needs the OpenAI Agents SDK: pip install -e"
        " '.[openai-agents]' in your clone of Lantern (or pip install openai-agents)"
    ) from exc

__all__ = ["DurableAgent", "durable"]

# As Lantern's own model steps: a transient provider error is tried again, up to 3 attempts.
MODEL_RETRY: Mapping[str, Any] = {"maxAttempts": 3, "backoffMs": 500, "retryableClasses": ["llm"]}
_OUTPUT: TypeAdapter[list[TResponseOutputItem]] = TypeAdapter(list[TResponseOutputItem])


@dataclasses.dataclass(frozen=True)
class _Steps:
    ctx: Context
    prefix: str
    model_retry: Mapping[str, Any] | None
    tool_retry: Mapping[str, Any] | None


class _StepModel(Model):
    """A model whose every response is a step of the run, sent with the step's key."""

    def __init__(self, wrapped: Model, steps: _Steps) -> None:
        self._wrapped = wrapped
        self._steps = steps

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        steps = self._steps
        given, settings_at = list(args), 2  # (system_instructions, input, model_settings, ...)

        async def request() -> dict[str, Any]:
            key = {"Idempotency-Key": steps.ctx.idempotency_key}
            if len(given) > settings_at:
                given[settings_at] = _keyed(given[settings_at], key)
            else:
                kwargs["model_settings"] = _keyed(kwargs.get("model_settings"), key)
            try:
                response = await self._wrapped.get_response(*given, **kwargs)
            except APIStatusError as exc:
                status = exc.status_code
                transient = status in (408, 409, 429) or status >= 500
                raise StepError(_one_line(exc), error_class="llm", retryable=transient) from exc
            except APIConnectionError as exc:  # no answer at all: a connection failure, timeout
                raise StepError(_one_line(exc), error_class="llm", retryable=True) from exc
            usage = response.usage
            return {
                "output": _OUTPUT.dump_python(response.output, mode="json"),
                "usage": {
                    "requests": usage.requests,
                    "inputTokens": usage.input_tokens,
                    "outputTokens": usage.output_tokens,
                    "totalTokens": usage.total_tokens,
                },
                "responseId": response.response_id,
            }

        name = f"{steps.prefix}.model"
        request.__qualname__ = name
        recorded = await steps.ctx.step(name, request, retry=steps.model_retry)
        used = recorded["usage"]
        return ModelResponse(
            output=_OUTPUT.validate_python(recorded["output"]),
            usage=Usage(
                requests=used["requests"],
                input_tokens=used["inputTokens"],
                output_tokens=used["outputTokens"],
                total_tokens=used["totalTokens"],
            ),
            response_id=recorded.get("responseId"),
        )

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise UsageError(
            "durable(agent) journals whole model responses: run it with durable(agent).run,"
            " not Runner.run_streamed"
        )


def _keyed(settings: ModelSettings | None, key: dict[str, str]) -> ModelSettings:
    base = settings or ModelSettings()
    return dataclasses.replace(base, extra_headers={**(base.extra_headers or {}), **key})


class _StepProvider(ModelProvider):
    """The run's model provider: the user's (or the SDK's default), its models made steps."""

    def __init__(self, wrapped: ModelProvider, steps: _Steps) -> None:
        self._wrapped = wrapped
        self._steps = steps

    def get_model(self, model_name: str | None) -> Model:
        return _StepModel(self._wrapped.get_model(model_name), self._steps)


def _step_tool(tool: FunctionTool, steps: _Steps) -> FunctionTool:
    invoke = tool.on_invoke_tool
    name = f"{steps.prefix}.tool.{tool.name}"

    async def on_invoke_tool(context: ToolContext[Any], arguments: str) -> Any:
        async def call() -> dict[str, Any]:
            value = await invoke(context, arguments)
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                value = str(value)  # what the SDK hands the model of it anyway
            return {"return": value}

        call.__qualname__ = name
        recorded = await steps.ctx.step(name, call, retry=steps.tool_retry)
        return recorded.get("return")

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)


def _copied(agent: Agent[Any], steps: _Steps, done: dict[int, Agent[Any]]) -> Agent[Any]:
    """A copy of ``agent`` whose function tools are steps, and of the agents it hands off to
    (each once, so handoffs that loop back stay a loop)."""
    if id(agent) in done:
        return done[id(agent)]
    tools = [_step_tool(t, steps) if isinstance(t, FunctionTool) else t for t in agent.tools]
    own = agent.model  # a Model object given to the agent is not looked up through the provider
    copy = agent.clone(tools=tools, model=_StepModel(own, steps) if isinstance(own, Model) else own)
    done[id(agent)] = copy
    copy.handoffs = [_copied(h, steps, done) if isinstance(h, Agent) else h for h in agent.handoffs]
    return copy


class DurableAgent:
    """An OpenAI Agents SDK agent whose model responses and tool calls are steps of a run."""

    def __init__(
        self,
        agent: Agent[Any],
        *,
        name: str | None = None,
        model_retry: Mapping[str, Any] | None = MODEL_RETRY,
        tool_retry: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(agent, Agent):
            raise UsageError(f"durable(agent) takes an agents.Agent, not {agent!r}")
        prefix = name or "openai-agents"
        if not isinstance(prefix, str) or "#" in prefix or len(prefix) > 100:
            raise UsageError(
                f"durable(agent, name={prefix!r}): the name prefixes step ids: a string of at"
                " most 100 characters without '#'"
            )
        self.agent = agent
        self.name = prefix
        self.model_retry = model_retry
        self.tool_retry = tool_retry

    async def run(self, ctx: Context, input: Any, /, **kwargs: Any) -> RunResult:
        """``Runner.run(agent, input, **kwargs)`` with each model response and each function
        tool call a step of ``ctx``'s run (``<name>.model``, ``<name>.tool.<tool>``; repeats
        are numbered ``#2``, ``#3``, ...). ``run_config`` is honoured: its model provider (or
        its ``model``) is the one wrapped."""
        if not isinstance(ctx, Context):
            raise UsageError(
                "durable(agent).run(ctx, input): ctx is the lantern.Context of an async"
                " code-first agent"
            )
        steps = _Steps(ctx, self.name, self.model_retry, self.tool_retry)
        config: RunConfig = kwargs.pop("run_config", None) or RunConfig()
        provider = _StepProvider(config.model_provider or MultiProvider(), steps)
        model = config.model
        if isinstance(model, Model):
            model = _StepModel(model, steps)
        config = dataclasses.replace(config, model_provider=provider, model=model)
        return await Runner.run(_copied(self.agent, steps, {}), input, run_config=config, **kwargs)


def durable(
    agent: Agent[Any],
    *,
    name: str | None = None,
    model_retry: Mapping[str, Any] | None = MODEL_RETRY,
    tool_retry: Mapping[str, Any] | None = None,
) -> DurableAgent:
    """Make ``agent`` durable: ``await durable(agent).run(ctx, input)`` inside a code-first
    agent. ``name`` prefixes its step ids (default ``openai-agents``); ``model_retry`` /
    ``tool_retry`` are the steps' retry policies, as ``ctx.step`` takes."""
    return DurableAgent(agent, name=name, model_retry=model_retry, tool_retry=tool_retry)


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())
