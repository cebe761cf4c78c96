"""The steps a VM asks the control plane to perform: ``ctx.model`` and ``ctx.tool``.

A VM has no network and no keys, so a workload's model call is made here, with this
process's providers and keys, through the same model layer as an in-process agent's
(``lantern.models.call``, its router, its spend gate), and a tool is the one registered on
this process's ``App``. Either is a journaled step like any other: ``step_started`` before
the work (fenced on the run lease the VM's runtime node holds), the work observed (its span,
its duration, its usage), then ``step_completed`` with the output, or ``step_retrying`` and
another attempt, or ``step_failed``; all through THE fenced commit. The output goes back to
the VM over its channel. A step in flight when the VM was lost is attempted again with the
same attempt and the same idempotency key, as in-process. A model call a rate limit holds
back (``step_throttled``) is not waited out here: the VM is answered with its due time and
asks again then (as for a retry of its own step), holding its runtime node's slot but no
request, no provider connection and no replica's run slot, where an in-process run parks.

``ctx.approval``, ``ctx.run_agent``, ``ctx.sleep`` and ``ctx.wait_for_signal`` are waits
(``prepare_wait``): the same ``step_started`` and ``step_waiting`` as an in-process code agent's,
resolved the same way (``lantern.engine.function_waits``: a decision through the approvals API,
the child run's end, the journaled due time, a signal the step ledger gives the wait), then
``step_resumed`` (after ``signal_received``) and ``step_completed``. What differs is only
that the VM waits, holding its runtime node's slot, where an in-process run parks.

``prepare`` and ``prepare_wait`` check the request before anything is journaled (one clear
error, 422).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from lantern.app import App, ToolContext
from lantern.effects.claims import Deliveries
from lantern.engine import call_args, runs, signals
from lantern.engine.ledger import Ledger
from lantern.engine.retries import RetryPolicy
from lantern.engine.spend import gate
from lantern.errors import Conflict, NotFound, StepError, UsageError
from lantern.ids import child_run_id
from lantern.models import registry, tools
from lantern.models.call import call, journal_usage
from lantern.models.records import ModelRequest, tool_calls_json
from lantern.store.base import Store
from lantern.store.records import Lease, Run

# (attempt, idempotency key) -> the step's output
Work = Callable[[int, str], Awaitable[Any]]


@dataclass(frozen=True)
class Prepared:
    step_type: str  # "llm" or "tool": spans, metrics, and what step_started says
    started: dict[str, Any]  # step_started's data
    policy: RetryPolicy
    work: Work
    usage: Callable[[Any], dict[str, Any] | None]


def prepare(
    request: Any,
    *,
    step: str,
    run: Run,
    lease: Lease,
    store: Store,
    app: App,
    models: registry.Models,
    ledger: Ledger,
) -> Prepared:
    """The step ``request`` asks for, checked; a UsageError says what is wrong with it. A
    model call is gated by the run's ledger (the agent's budget, the spend so far), as every
    kind of run's is."""
    if not isinstance(request, dict):
        raise UsageError("call must be an object with a kind, 'model' or 'tool'")
    kind = request.get("kind")
    if kind == "model":
        return _model(request, run, store, app, models, ledger)
    if kind == "tool":
        return _tool(request, step, run, lease, store, app)
    raise UsageError(f"call kind {kind!r} is not performed for a VM: use 'model' or 'tool'")


def _model(
    request: dict[str, Any],
    run: Run,
    store: Store,
    app: App,
    models: registry.Models,
    ledger: Ledger,
) -> Prepared:
    model = call_args.model_name(request.get("model"), models.routes)
    prompt, messages = request.get("prompt"), request.get("messages")
    if messages is not None and not isinstance(messages, list):
        raise UsageError("ctx.model: messages must be a list")
    conversation = call_args.messages(prompt, messages)
    system = request.get("system")
    if system is not None and not isinstance(system, str):
        raise UsageError("ctx.model: system must be a string")
    temperature, max_tokens = request.get("temperature"), request.get("maxTokens")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, int | float)
    ):
        raise UsageError("ctx.model: temperature must be a number")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise UsageError("ctx.model: max_tokens must be a positive integer")
    missing = "on the control plane's App"
    box = app.tools_for(run.workspace)
    specs = call_args.tool_specs(box, request.get("tools") or [], missing=missing)
    policy = call_args.retry_policy(request.get("retry"), "ctx.model", "model")

    async def work(attempt: int, key: str) -> Any:
        ask = ModelRequest(
            model=model,
            messages=conversation,
            idempotency_key=key,
            system=system,
            temperature=temperature,
            max_tokens=max_tokens,
            tools=await tools.offered(box, specs),
        )
        result = await call(models, ask, gate(store, run, ledger, models))
        output = result.output()
        output["toolCalls"] = tool_calls_json(result.response.tool_calls)
        return output

    return Prepared("llm", {"type": "llm", "model": model}, policy, work, journal_usage)


def _tool(
    request: dict[str, Any], step: str, run: Run, lease: Lease, store: Store, app: App
) -> Prepared:
    name, args = request.get("tool"), request.get("args", {})
    if not isinstance(name, str):
        raise UsageError("ctx.tool: the tool name must be a string")
    if not isinstance(args, dict):
        raise UsageError(f"ctx.tool({name!r}): the arguments must be an object")
    box = app.tools_for(run.workspace)
    if not box.has(name):
        raise UsageError(
            f"ctx.tool({name!r}): no such tool is registered on the control plane's App"
            " (use @app.tool or app.mcp in the --app that lantern serve loads)"
        )

    async def work(attempt: int, key: str) -> Any:
        # An MCP server's tool is looked up inside the step: a server that is down fails the
        # step (class tool, retryable), as in-process.
        found = await box.find(name)
        if found is None:
            raise StepError(f"tool {name!r}: its MCP server has no such tool", error_class="tool")
        try:
            checked = tools.validated(found, dict(args))
        except ValueError as exc:
            message = " ".join(str(exc).split())
            problem = f"invalid arguments for {name!r}: {message}"
            raise StepError(problem, error_class="tool") from None
        deliveries = Deliveries(store, lease, step_id=step, attempt=attempt, idempotency_key=key)
        context = ToolContext(run.id, step, attempt, key, deliveries.once, run.workspace)
        return await found.call(context, checked)

    data = {"type": "tool", "call": {"tool": name, "args": args}}
    return Prepared("tool", data, RetryPolicy(), work, _no_usage)


WAITS = ("approval", "run_agent", "sleep", "signal")

# (step, attempt) -> the step_waiting data (a sub-agent's child run is created by it)
MakeWait = Callable[[str, int], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Wait:
    started: dict[str, Any]  # step_started's data
    make: MakeWait  # journaled after step_started: a sub-agent's start is durable first


def prepare_wait(
    request: dict[str, Any], *, run: Run, store: Store, app: App, on_queued: Callable[[], None]
) -> Wait:
    """The wait ``request`` asks for (``kind`` approval, run_agent, sleep or signal), checked."""
    kind = request.get("kind")
    if kind == "sleep":
        due, seconds = request.get("dueAt"), request.get("seconds")
        if due is not None and (isinstance(due, bool) or not isinstance(due, int)):
            raise UsageError("ctx.sleep_until: dueAt must be epoch milliseconds")
        if due is None and (
            isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0
        ):
            raise UsageError("ctx.sleep: seconds must be a number >= 0")
        at: int | None = due
        ms: float = 0.0 if seconds is None else float(seconds) * 1000

        async def timer(step: str, attempt: int) -> dict[str, Any]:
            # Due from when the wait is first journaled; a resumed VM keeps that due time.
            when = at if at is not None else int(time.time() * 1000 + ms)
            return {"kind": "timer", "dueAt": when}

        return Wait({"type": "sleep"}, timer)
    if kind == "approval":
        prompt, assignees = request.get("prompt", ""), request.get("assignees", [])
        limit, on_timeout = request.get("timeoutMs"), request.get("onTimeout", "reject")
        if not isinstance(prompt, str):
            raise UsageError("ctx.approval: prompt must be a string")
        if not isinstance(assignees, list) or not all(isinstance(a, str) for a in assignees):
            raise UsageError("ctx.approval: assignees must be a list of strings")
        if on_timeout not in ("approve", "reject"):
            raise UsageError("ctx.approval: on_timeout is 'approve' or 'reject'")
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0
        ):
            raise UsageError("ctx.approval: timeout_ms must be a positive integer")

        async def decision(step: str, attempt: int) -> dict[str, Any]:
            data: dict[str, Any] = {"kind": "approval", "prompt": prompt, "assignees": assignees}
            if limit is not None:
                data["dueAt"] = int(time.time() * 1000 + limit)
                data["onTimeout"] = on_timeout
            return data

        return Wait({"type": "approval"}, decision)
    if kind == "signal":
        wanted = signals.check_name(request.get("name"), "ctx.wait_for_signal")
        limit = request.get("timeoutMs")
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0
        ):
            raise UsageError("ctx.wait_for_signal: timeout_s must be a positive number")

        async def signal(step: str, attempt: int) -> dict[str, Any]:
            return signals.wait(wanted, limit)

        return Wait({"type": "signal", "name": wanted}, signal)
    if kind == "run_agent":
        name = request.get("agentName")
        if not isinstance(name, str) or not name:
            raise UsageError("ctx.run_agent: the agent name must be a non-empty string")
        given = request.get("input")

        async def child(step: str, attempt: int) -> dict[str, Any]:
            child_id = child_run_id(run.id, step, attempt)
            try:
                await runs.create_run(
                    store,
                    name,
                    given,
                    run.workspace,
                    idempotency_key=f"subagent:{child_id}",
                    run_id=child_id,
                    parent_id=run.id,
                    app=app,
                )
            except (NotFound, UsageError, Conflict) as exc:
                raise StepError(f"sub-agent {name!r}: {exc}", error_class="tool") from exc
            on_queued()
            return {"kind": "subagent", "agentName": name, "childRunId": child_id}

        return Wait({"type": "subagent", "agentName": name}, child)
    raise UsageError(f"call kind {kind!r} is not a wait: use one of {', '.join(WAITS)}")


def _no_usage(output: Any) -> None:
    return None
