"""The checks of a ``ctx.model`` call's arguments (and any ctx call's ``retry``), once for both
places such a call is made: the engine's Context (``function_context``) and the calls a VM
asks the control plane to perform (``lantern.runtime.calls``). Each raises UsageError saying
what is wrong before anything is journaled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lantern.app import Toolbox
from lantern.engine.graph import RETRYABLE_CLASSES
from lantern.engine.retries import RetryPolicy
from lantern.errors import UsageError
from lantern.models import registry, router
from lantern.models.records import Message, ToolCall, ToolSpec


def model_name(model: Any, routes: router.Routes | None) -> str:
    """``model`` as a model name the process can route (``route:NAME`` among ``routes``)."""
    if not isinstance(model, str) or not model:
        raise UsageError(f"ctx.model: the model must be a model name, not {model!r}")
    problem = registry.model_problem(model, routes)
    if problem is not None:
        raise UsageError(f"ctx.model({model!r}): {problem}")
    return model


def retry_policy(retry: Any, where: str, kind: str | None = None) -> RetryPolicy:
    """A ctx call's ``retry`` (a node's retry block) as a policy; None: the default of a step
    of ``kind`` (``model``: transient errors retried, as a graph's ai-step is; else one
    attempt)."""
    if retry is None:
        return RetryPolicy.of({}, kind)
    if not isinstance(retry, Mapping):
        raise UsageError(f"{where}: retry must be a mapping such as {{'maxAttempts': 3}}")
    attempts = retry.get("maxAttempts", 1)
    backoff = retry.get("backoffMs", 0)
    classes = retry.get("retryableClasses", ["any"])
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 100:
        raise UsageError(f"{where}: retry maxAttempts must be an integer from 1 to 100")
    if isinstance(backoff, bool) or not isinstance(backoff, int) or backoff < 0:
        raise UsageError(f"{where}: retry backoffMs must be an integer >= 0")
    if not isinstance(classes, list | tuple) or not set(classes) <= RETRYABLE_CLASSES:
        known = ", ".join(sorted(RETRYABLE_CLASSES))
        raise UsageError(f"{where}: retry retryableClasses are some of {known}")
    return RetryPolicy.of({"retry": {**retry, "retryableClasses": list(classes)}})


def messages(prompt: Any, given: Sequence[Mapping[str, Any]] | None) -> tuple[Message, ...]:
    """The conversation of a ctx.model call: ``prompt`` as a user message, then ``given``."""
    out: list[Message] = []
    if prompt is not None:
        if not isinstance(prompt, str):
            raise UsageError("ctx.model: prompt must be a string")
        out.append(Message("user", prompt))
    for m in given or ():
        role = m.get("role") if isinstance(m, Mapping) else None
        if role not in ("user", "assistant", "tool") or not isinstance(m.get("content"), str):
            raise UsageError(
                "ctx.model: each message is {'role': 'user'|'assistant'|'tool', 'content': str}"
            )
        calls = tuple(ToolCall.from_json(c) for c in m.get("toolCalls") or ())
        out.append(Message(role, m["content"], calls, m.get("toolCallId")))
    if not out:
        raise UsageError("ctx.model: give a prompt or messages")
    return tuple(out)


def tool_specs(box: Toolbox, given: Any, *, missing: str) -> tuple[str | ToolSpec, ...]:
    """The tools a ctx.model call names, checked now; names are looked up when the step runs
    (``tools.offered``), so a replayed step needs no MCP server started. ``missing`` ends
    the error for a name the app lacks (where to register it)."""
    if not isinstance(given, list | tuple):
        raise UsageError("ctx.model: tools must be a list")
    specs: list[str | ToolSpec] = []
    for t in given:
        if isinstance(t, str):
            if not box.has(t):
                raise UsageError(f"ctx.model: no tool {t!r} is registered {missing}")
            specs.append(t)
        elif isinstance(t, Mapping) and isinstance(t.get("name"), str):
            specs.append(
                ToolSpec(t["name"], str(t.get("description", "")), dict(t.get("parameters") or {}))
            )
        else:
            raise UsageError("ctx.model: tools are tool names or {name, description, parameters}")
    return tuple(specs)
