"""Pydantic AI agents made durable inside a code-first agent (docs/integrations.md), the optional
extra ``lantern[pydantic-ai]``.

``await durable(agent).run(ctx, prompt)`` runs the Pydantic AI agent with two wrappers added
for that run, as the durable engines that integrate with Pydantic AI do: the model that serves
each request is wrapped so that ``request`` is a Lantern step (``<name>.model``), and the
agent's tools (its function tools and its toolsets, MCP servers included) are wrapped so that
each ``call_tool`` is a step (``<name>.tool.<tool>``). Both go through ``ctx.step``, so each
has the step's idempotency key, is journaled, and after a crash returns its journaled value
without being run again: a completed model turn is not paid for twice, a completed tool call
is not repeated; the one step in flight at the crash runs again with the same key.

A model response crosses the journal as JSON (``ModelMessagesTypeAdapter``) and a tool's
return value as its JSON form; the agent gets the value back from the journal's form on the
first run too, so a replay sees exactly what the first run saw. A tool's ``ModelRetry`` (and
the deferral signals ``CallDeferred`` / ``ApprovalRequired``) is journaled as data and raised
again, so it stays Pydantic AI's control flow rather than a failed step.

Every model request carries its step attempt's key as the ``Idempotency-Key`` header (the
request's ``extra_headers``), as Lantern's own model calls do, so the request in flight at a
crash is re-sent with the key it was first sent with. ``run_stream`` streams each request's
text, as it is generated, to whoever follows the run (``ctx.live_text``) and journals the
whole response as ``run`` does.

Tool calls run one at a time, in the order the model gave them: step ids are positions in the
run, so they must be claimed in the same order on every replay.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from lantern.context import Context
from lantern.errors import StepError, UsageError

try:
    from pydantic import TypeAdapter
    from pydantic_ai import Agent
    from pydantic_ai.agent import AbstractAgent
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.exceptions import (
        ApprovalRequired,
        CallDeferred,
        ModelAPIError,
        ModelHTTPError,
        ModelRetry,
    )
    from pydantic_ai.messages import (
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelResponse,
        PartDeltaEvent,
        PartStartEvent,
        TextPart,
        TextPartDelta,
        ToolReturn,
    )
    from pydantic_ai.models import Model, ModelRequestParameters
    from pydantic_ai.models.wrapper import WrapperModel
    from pydantic_ai.run import AgentRunResult
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.tools import RunContext
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool, WrapperToolset
    from pydantic_core import to_jsonable_python
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "lantern.integrations.pydantic_ai needs Pydantic AI: pip install -e '.[pydantic-ai]'"
        " in your clone of Lantern (or pip install pydantic-ai-slim)"
    ) from exc

__all__ = ["DurableAgent", "durable"]

OutputT = TypeVar("OutputT")
# As Lantern's own model steps: a transient provider error (a connection failure, 408, 409,
# 429, a 5xx) is tried again, up to 3 attempts from 500 ms of backoff.
MODEL_RETRY: Mapping[str, Any] = {"maxAttempts": 3, "backoffMs": 500, "retryableClasses": ["llm"]}
_TOOL_RETURN: TypeAdapter[ToolReturn[Any]] = TypeAdapter(ToolReturn[Any])


@dataclass(frozen=True)
class _Steps:
    """How one run's model requests and tool calls become steps of ``ctx``."""

    ctx: Context
    prefix: str
    model_retry: Mapping[str, Any] | None
    tool_retry: Mapping[str, Any] | None
    stream: bool = False

    async def model_request(
        self,
        model: Model,
        messages: list[ModelMessage],
        settings: ModelSettings | None,
        parameters: ModelRequestParameters,
    ) -> ModelResponse:
        async def request() -> Any:
            keyed = _with_key(model, settings, self.ctx.idempotency_key)
            try:
                if self.stream:
                    response = await _streamed(self.ctx, model, messages, keyed, parameters)
                else:
                    response = await model.request(messages, keyed, parameters)
            except ModelHTTPError as exc:
                status = exc.status_code
                transient = status in (408, 409, 429) or status >= 500
                raise StepError(_one_line(exc), error_class="llm", retryable=transient) from exc
            except ModelAPIError as exc:  # no answer at all: a connection failure, a timeout
                raise StepError(_one_line(exc), error_class="llm", retryable=True) from exc
            return ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]

        request.__qualname__ = f"{self.prefix}.model"
        recorded = await self.ctx.step(f"{self.prefix}.model", request, retry=self.model_retry)
        (response,) = ModelMessagesTypeAdapter.validate_python([recorded])
        if not isinstance(response, ModelResponse):
            raise StepError(
                f"step {self.prefix}.model: the journal holds no model response", error_class="tool"
            )
        return response

    async def call_tool(
        self,
        toolset: AbstractToolset[Any],
        name: str,
        args: dict[str, Any],
        run: RunContext[Any],
        tool: ToolsetTool[Any],
    ) -> Any:
        async def call() -> dict[str, Any]:
            try:
                result = await toolset.call_tool(name, args, run, tool)
            except ModelRetry as exc:  # the model is asked to try again: its turn, not a failure
                return {"modelRetry": exc.message}
            except CallDeferred as exc:
                kind = getattr(exc, "kind", "external")  # older releases have none
                return {"callDeferred": _json(exc.metadata, name), "kind": kind}
            except ApprovalRequired as exc:
                return {"approvalRequired": _json(exc.metadata, name)}
            if isinstance(result, ToolReturn):
                return {"toolReturn": _TOOL_RETURN.dump_python(result, mode="json")}
            return {"return": _json(result, name)}

        step = f"{self.prefix}.tool.{name}"
        call.__qualname__ = step
        recorded = await self.ctx.step(step, call, retry=self.tool_retry)
        return _replayed(recorded)


def _with_key(model: Model, settings: ModelSettings | None, key: str) -> ModelSettings:
    """``settings`` with the step attempt's key as the request's ``Idempotency-Key`` header,
    beside the headers the agent's and the model's own settings give."""
    merged: dict[str, Any] = dict(settings or {})
    headers = {
        **((model.settings or {}).get("extra_headers") or {}),
        **(merged.get("extra_headers") or {}),
        "Idempotency-Key": key,
    }
    merged["extra_headers"] = headers
    return cast(ModelSettings, merged)


async def _streamed(
    ctx: Context,
    model: Model,
    messages: list[ModelMessage],
    settings: ModelSettings,
    parameters: ModelRequestParameters,
) -> ModelResponse:
    """The response, its text sent to the run's followers as the provider streams it."""
    with ctx.live_text() as sink:
        if sink is None:  # nobody follows the run here: one whole answer costs less
            return await model.request(messages, settings, parameters)
        async with model.request_stream(messages, settings, parameters) as streamed:
            async for event in streamed:
                if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                    sink(event.part.content)
                elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                    sink(event.delta.content_delta)
            return streamed.get()


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _json(value: Any, tool: str) -> Any:
    try:
        return to_jsonable_python(value)
    except Exception as exc:
        raise StepError(
            f"tool {tool!r} returned a value the journal cannot store as JSON: {exc}",
            error_class="tool",
        ) from None


def _replayed(recorded: Mapping[str, Any]) -> Any:
    """A tool call's journaled outcome as Pydantic AI expects it: a value, or its signal."""
    if "modelRetry" in recorded:
        raise ModelRetry(str(recorded["modelRetry"]))
    if "callDeferred" in recorded:
        kind = recorded.get("kind", "external")
        raise CallDeferred(
            recorded["callDeferred"], **({} if kind == "external" else {"kind": kind})
        )
    if "approvalRequired" in recorded:
        raise ApprovalRequired(recorded["approvalRequired"])
    if "toolReturn" in recorded:
        return _TOOL_RETURN.validate_python(recorded["toolReturn"])
    return recorded.get("return")


class _StepModel(WrapperModel):
    """The model of one request, whose ``request`` is a step."""

    def __init__(self, wrapped: Model, steps: _Steps) -> None:
        super().__init__(wrapped)
        self._steps = steps

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        return await self._steps.model_request(
            self.wrapped, messages, model_settings, model_request_parameters
        )

    def request_stream(self, *args: Any, **kwargs: Any) -> Any:
        raise UsageError(
            "durable(agent) journals whole model responses: stream their text to the run's"
            " followers with durable(agent).run_stream(ctx, prompt), not Agent.run_stream"
        )


@dataclass
class _StepToolset(WrapperToolset[Any]):
    """The agent's assembled toolset, whose ``call_tool`` is a step."""

    steps: _Steps | None = field(default=None, kw_only=True)

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        assert self.steps is not None
        return await self.steps.call_tool(self.wrapped, name, tool_args, ctx, tool)


@dataclass(init=False)
class _Durable(AbstractCapability[Any]):
    """A per-run capability that routes the run's model requests and tool calls through
    ``_Steps``."""

    steps: _Steps

    def __init__(self, steps: _Steps) -> None:
        self.steps = steps

    def get_wrapper_model(self, model: Model) -> Model | None:
        return _StepModel(model, self.steps)

    def get_wrapper_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any] | None:
        return _StepToolset(toolset, steps=self.steps)


class DurableAgent(Generic[OutputT]):
    """A Pydantic AI agent whose model requests and tool calls are steps of a Lantern run."""

    def __init__(
        self,
        agent: AbstractAgent[Any, OutputT],
        *,
        name: str | None = None,
        model_retry: Mapping[str, Any] | None = MODEL_RETRY,
        tool_retry: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(agent, AbstractAgent):
            raise UsageError(f"durable(agent) takes a pydantic_ai.Agent, not {agent!r}")
        prefix = name or agent.name or "pydantic-ai"
        if not isinstance(prefix, str) or "#" in prefix or len(prefix) > 100:
            raise UsageError(
                f"durable(agent, name={prefix!r}): the name prefixes step ids: a string of at"
                " most 100 characters without '#'"
            )
        self.agent = agent
        self.name = prefix
        self.model_retry = model_retry
        self.tool_retry = tool_retry

    async def run(
        self, ctx: Context, user_prompt: Any = None, /, **kwargs: Any
    ) -> AgentRunResult[OutputT]:
        """``agent.run(user_prompt, **kwargs)`` with each model request and each tool call a
        step of ``ctx``'s run (``<name>.model``, ``<name>.tool.<tool>``; repeats are numbered
        ``#2``, ``#3``, ... as for any step). The keyword arguments are ``Agent.run``'s."""
        return await self._run(ctx, user_prompt, False, kwargs)

    async def run_stream(
        self, ctx: Context, user_prompt: Any = None, /, **kwargs: Any
    ) -> AgentRunResult[OutputT]:
        """``run``, with each model request's text streamed as the provider generates it to
        whoever follows the run (``GET /v1/runs/{id}/stream``, ``event: delta``), as
        ``ctx.model`` streams; the journal still holds each whole response, and a retried
        request's text replaces the failed attempt's. Returns what ``run`` returns."""
        return await self._run(ctx, user_prompt, True, kwargs)

    async def _run(
        self, ctx: Context, user_prompt: Any, stream: bool, kwargs: dict[str, Any]
    ) -> AgentRunResult[OutputT]:
        if not isinstance(ctx, Context):
            raise UsageError(
                "durable(agent).run(ctx, prompt): ctx is the lantern.Context of an async"
                " code-first agent"
            )
        if kwargs.get("event_stream_handler") is not None:
            raise UsageError(
                "durable(agent).run: an event_stream_handler would see a replayed response as"
                " one piece; use durable(agent).run_stream(ctx, prompt) to stream the text to"
                " the run's followers"
            )
        steps = _Steps(ctx, self.name, self.model_retry, self.tool_retry, stream)
        capabilities = [_Durable(steps), *(kwargs.pop("capabilities", None) or ())]
        # One call at a time, in the model's order: step ids are claimed by position.
        with Agent.parallel_tool_call_execution_mode("sequential"):
            result: AgentRunResult[OutputT] = await self.agent.run(
                user_prompt, capabilities=capabilities, **kwargs
            )
        return result


def durable(
    agent: AbstractAgent[Any, OutputT],
    *,
    name: str | None = None,
    model_retry: Mapping[str, Any] | None = MODEL_RETRY,
    tool_retry: Mapping[str, Any] | None = None,
) -> DurableAgent[OutputT]:
    """Make ``agent`` durable: ``await durable(agent).run(ctx, prompt)`` inside a code-first
    agent. ``name`` prefixes its step ids (default: the agent's name, else ``pydantic-ai``);
    ``model_retry`` / ``tool_retry`` are the steps' retry policies, as ``ctx.step`` takes
    (default: a model request's transient errors, class ``llm``, get 3 attempts from 500 ms of
    backoff; a tool call gets one attempt)."""
    return DurableAgent(agent, name=name, model_retry=model_retry, tool_retry=tool_retry)
