"""The engine's ``lantern.Context``: each call a journaled step of a ``FunctionRun``.

``EngineContext`` is what an ``async def`` agent receives; a plain ``def`` agent runs on a
worker thread and receives ``BlockingContext``, the same methods made blocking. The step a
function is inside (for ``step_id``, ``attempt``, ``idempotency_key``, ``deliver_once`` and
``key_for``) is a context variable, so concurrent steps (``asyncio.gather``) each see their
own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import json
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from lantern.app import Approval, CodeAgent, Context, ModelReply, ToolContext
from lantern.effects.claims import Deliveries
from lantern.engine import call_args, determinism, signals
from lantern.engine import events as ev
from lantern.engine.children import start_child
from lantern.engine.drive import DriveHost, attempts
from lantern.engine.function_waits import resolved
from lantern.engine.ledger import (
    Attempt,
    Completed,
    Due,
    Entry,
    Exit,
    Failed,
    FailedStep,
    Ledger,
    Nondeterminism,
    Parked,
    Raise,
    Replay,
    Usage,
    no_usage,
)
from lantern.engine.retries import RetryPolicy
from lantern.engine.spend import gate
from lantern.errors import StepError, UsageError
from lantern.models import tools
from lantern.models.call import call, journal_usage
from lantern.models.records import ModelRequest, tool_calls_json
from lantern.models.tools import offered
from lantern.store.codec import dumps
from lantern.store.records import NewEvent, Run

T = TypeVar("T")
MAX_TO = 2048  # ctx.deliver_once(to=...): a URL or an address, as the deliveries table shows
Draft = tuple[str, dict[str, Any], str | None, int | None]


@dataclass(frozen=True)
class _Attempt:
    step: str
    attempt: int
    key: str
    deliveries: Deliveries


class FunctionRun(Protocol):
    """What a Context uses of its run's drive (``functions.FunctionRun``): the ledger, the
    step primitives of ``Drive``, and the function drive's queue of events to commit. A
    Protocol, so this module does not import the drive that imports it."""

    run: Run
    host: DriveHost
    agent: CodeAgent | None
    ledger: Ledger
    closed: bool
    halt: asyncio.Event
    pending: list[NewEvent]
    parked: dict[str, dict[str, Any]]
    throttled: bool  # a step parks the run for a rate limit's wait

    def claim(self, name: str) -> tuple[str, Entry]: ...
    def must_stop(self) -> bool: ...
    async def stopped(self) -> Any: ...
    def check_live(self) -> None: ...
    async def emit(self, drafts: list[Draft]) -> None: ...
    async def notice(self, events: list[NewEvent]) -> None: ...
    def add(self, event: NewEvent) -> None: ...
    async def durable(self) -> None: ...
    def settle(
        self, step: str, attempt: int, outcome: Any, policy: RetryPolicy, usage: Usage = ...
    ) -> Exit: ...
    async def backoff(self, due_ms: int, halt: asyncio.Event | None = None) -> bool: ...
    def key(self, step: str, attempt: int) -> str: ...
    def deliveries(self, step: str, attempt: int) -> Deliveries: ...
    def perform(
        self, step: str, attempt: int, work: Awaitable[Any], timeout: float | None = None
    ) -> asyncio.Task[Any]: ...
    def begin_attempt(self) -> None: ...
    def end_attempt(self) -> None: ...


_CURRENT: ContextVar[_Attempt | None] = ContextVar("lantern_step", default=None)


def _inside(what: str) -> _Attempt:
    current = _CURRENT.get()
    if current is None:
        raise UsageError(
            f"ctx.{what} is known inside a step only: use it in the function ctx.step runs"
        )
    return current


class EngineContext(Context):
    def __init__(self, drive: FunctionRun) -> None:
        self._d = drive

    def _drive(self, call: str) -> FunctionRun:
        if self._d.closed:
            raise UsageError(
                f"ctx.{call}: this lantern.Context belongs to run {self._d.run.id}, whose drive"
                " has ended; use ctx only inside the agent's function while it runs"
            )
        return self._d

    @property
    def run_id(self) -> str:
        return self._d.run.id

    @property
    def step_id(self) -> str:
        return _inside("step_id").step

    @property
    def attempt(self) -> int:
        return _inside("attempt").attempt

    @property
    def idempotency_key(self) -> str:
        return _inside("idempotency_key").key

    @contextlib.contextmanager
    def live_text(self) -> Iterator[Callable[[str], None] | None]:
        a, d = _inside("live_text"), self._d
        live = d.host.live
        try:
            yield live.sink(d.run.id, a.step, a.attempt)
        finally:
            live.finished(d.run.id, a.step, a.attempt)

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        retry: Mapping[str, Any] | None = None,
        timeout_ms: int | None = None,
        **kwargs: Any,
    ) -> Any:
        self._drive("step")
        name = determinism.check_name(name, "ctx.step")
        if not callable(fn):
            raise UsageError(f"ctx.step({name!r}, fn): fn must be a function, not {fn!r}")
        policy = call_args.retry_policy(retry, f"ctx.step({name!r})")
        limit = _limit(timeout_ms, name)
        data = {"type": "step", "function": getattr(fn, "__qualname__", repr(fn))[:200]}

        async def work(_: _Attempt) -> Any:
            return await _call(fn, args, kwargs)

        return await self._perform(name, data, work, policy, limit)

    async def model(
        self,
        model: str,
        *,
        prompt: str | None = None,
        system: str | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        tools: Sequence[str | Mapping[str, Any]] | None = None,
        name: str = "model",
        temperature: float | None = None,
        max_tokens: int | None = None,
        retry: Mapping[str, Any] | None = None,
    ) -> ModelReply:
        d = self._drive("model")
        name = determinism.check_name(name, "ctx.model")
        model = call_args.model_name(model, d.host.models.routes)
        conversation = call_args.messages(prompt, messages)
        missing = "(use @app.tool or app.mcp)"
        box = d.host.app.tools_for(d.run.workspace)
        specs = call_args.tool_specs(box, tools or (), missing=missing)
        policy = call_args.retry_policy(retry, f"ctx.model({name!r})", "model")

        async def work(a: _Attempt) -> Any:
            request = ModelRequest(
                model=model,
                messages=conversation,
                idempotency_key=a.key,
                system=system,
                temperature=temperature,
                max_tokens=max_tokens,
                tools=await offered(box, specs),
            )
            # The text streams to whoever follows the run here as it is generated (never
            # journaled); a retry's attempt starts a new buffer that replaces this one's.
            live = d.host.live
            on_text = live.sink(d.run.id, a.step, a.attempt)
            checked = gate(d.host.store, d.run, d.ledger, d.host.models)
            try:
                result = await call(d.host.models, request, checked, on_text=on_text)
            finally:
                live.finished(d.run.id, a.step, a.attempt)
            output = result.output()
            output["toolCalls"] = tool_calls_json(result.response.tool_calls)
            return output

        data = {"type": "llm", "model": model}
        output = await self._perform(name, data, work, policy, None, usage=journal_usage)
        return ModelReply.from_json(output)

    async def tool(self, name: str, /, **args: Any) -> Any:
        d = self._drive("tool")
        name = determinism.check_name(name, "ctx.tool")
        box = d.host.app.tools_for(d.run.workspace)
        if not box.has(name):
            raise UsageError(
                f"ctx.tool({name!r}): no such tool is registered (use @app.tool or app.mcp)"
            )
        try:
            json.loads(dumps(args))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"ctx.tool({name!r}): the arguments are not JSON: {exc}") from None

        async def work(a: _Attempt) -> Any:
            # An MCP server's tool is looked up inside the step: a server that is down fails
            # the step (ToolUnavailable: class tool, retryable), as in a graph.
            found = await box.find(name)
            if found is None:
                raise StepError(
                    f"tool {name!r}: its MCP server has no such tool", error_class="tool"
                )
            try:
                checked = tools.validated(found, dict(args))
            except ValueError as exc:
                message = " ".join(str(exc).split())
                raise StepError(
                    f"invalid arguments for {name!r}: {message}", error_class="tool"
                ) from None
            context = _tool_context(d, a)
            return await found.call(context, checked)

        data = {"type": "tool", "call": {"tool": name, "args": args}}
        return await self._perform(name, data, work, RetryPolicy(), None)

    async def deliver_once(self, name: str, fn: Callable[[], Any], *, to: str | None = None) -> Any:
        self._drive("deliver_once")
        if to is not None and (not isinstance(to, str) or not 0 < len(to) <= MAX_TO):
            raise UsageError(
                f"ctx.deliver_once({name!r}, to=...): where it goes is a string of 1 to"
                f" {MAX_TO} characters"
            )
        current = _CURRENT.get()
        if current is not None:  # a delivery of the step it is called in, as for tools
            return await current.deliveries.once(name, fn, kind="code", target=to)
        name = determinism.check_name(name, "ctx.deliver_once")

        async def work(a: _Attempt) -> Any:
            return await a.deliveries.once(name, fn, kind="code", target=to)

        return await self._perform(name, {"type": "delivery"}, work, RetryPolicy(), None)

    async def sleep(self, name: str, *, seconds: float) -> None:
        self._drive("sleep")
        name = determinism.check_name(name, "ctx.sleep")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise UsageError(f"ctx.sleep({name!r}): seconds must be a number >= 0")
        await self._timer(name, int(time.time() * 1000 + seconds * 1000))

    async def sleep_until(self, name: str, when: datetime) -> None:
        self._drive("sleep_until")
        name = determinism.check_name(name, "ctx.sleep_until")
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise UsageError(f"ctx.sleep_until({name!r}): when must be an aware datetime")
        await self._timer(name, int(when.timestamp() * 1000))

    async def _timer(self, name: str, due_ms: int) -> None:
        async def wait(step: str, attempt: int) -> dict[str, Any]:
            return {"kind": "timer", "dueAt": due_ms}

        await self._wait(name, {"type": "sleep"}, wait)

    async def approval(
        self,
        name: str,
        *,
        prompt: str = "",
        assignees: Sequence[str] = (),
        timeout_ms: int | None = None,
        on_timeout: str = "reject",
    ) -> Approval:
        self._drive("approval")
        name = determinism.check_name(name, "ctx.approval")
        if not isinstance(prompt, str):
            raise UsageError(f"ctx.approval({name!r}): prompt must be a string")
        if isinstance(assignees, str) or not all(isinstance(a, str) for a in assignees):
            raise UsageError(f"ctx.approval({name!r}): assignees must be a list of strings")
        if on_timeout not in ("approve", "reject"):
            raise UsageError(f"ctx.approval({name!r}): on_timeout is 'approve' or 'reject'")
        limit = _limit(timeout_ms, name)

        async def wait(step: str, attempt: int) -> dict[str, Any]:
            data: dict[str, Any] = {
                "kind": "approval",
                "prompt": prompt,
                "assignees": list(assignees),
            }
            if limit is not None:
                data["dueAt"] = int(time.time() * 1000 + limit * 1000)
                data["onTimeout"] = on_timeout
            return data

        return Approval.from_json(await self._wait(name, {"type": "approval"}, wait))

    async def wait_for_signal(self, name: str, *, timeout_s: float | None = None) -> Any:
        self._drive("wait_for_signal")
        name = signals.check_name(name, "ctx.wait_for_signal")
        limit_ms = _timeout_ms(timeout_s, f"ctx.wait_for_signal({name!r})")

        async def wait(step: str, attempt: int) -> dict[str, Any]:
            return signals.wait(name, limit_ms)

        return await self._wait(name, {"type": "signal", "name": name}, wait)

    async def run_agent(self, name: str, input: Any) -> Any:
        d = self._drive("run_agent")
        name = determinism.check_name(name, "ctx.run_agent")

        async def wait(step: str, attempt: int) -> dict[str, Any]:
            child = d.ledger.child_id(step, attempt)
            h = d.host
            await start_child(h.store, h.app, d.run, child, name, input, h.on_queued)
            return {"kind": "subagent", "agentName": name, "childRunId": child}

        return await self._wait(name, {"type": "subagent", "agentName": name}, wait)

    # -- the step protocol -----------------------------------------------------------------

    async def _perform(
        self,
        name: str,
        data: dict[str, Any],
        work: Callable[[_Attempt], Awaitable[Any]],
        policy: RetryPolicy,
        limit: float | None,
        *,
        usage: Usage = no_usage,
    ) -> Any:
        d = self._d
        _not_nested(name)
        step, entry = d.claim(name)
        if d.must_stop():
            await d.stopped()
        if isinstance(entry, Replay):
            return entry.output
        if isinstance(entry, Raise):
            raise FailedStep(step, entry.error)
        assert not isinstance(entry, Nondeterminism)  # claim() has stopped the function
        due = entry.due_ms if isinstance(entry, Due) else None  # after a crash or a park too
        start = isinstance(entry, Attempt) and entry.start
        io = _Steps(self, step, data, work, policy, limit, usage)
        done = await attempts(io, entry.attempt, due, start)
        assert done is not None  # a stop never returns here: the drive cancels the function
        if isinstance(done.next, Completed):
            return done.next.output
        assert isinstance(done.next, Failed)
        await d.durable()
        raise FailedStep(step, done.next.error.to_json())

    async def _attempt(
        self,
        step: str,
        attempt: int,
        work: Callable[[_Attempt], Awaitable[Any]],
        limit: float | None,
    ) -> Any:
        """One attempt through Drive's ``perform`` (its span, duration and timeout); the
        step's context variable is set for the task it runs in."""
        d = self._d
        current = _Attempt(step, attempt, d.key(step, attempt), d.deliveries(step, attempt))
        token = _CURRENT.set(current)
        try:
            task = d.perform(step, attempt, work(current), limit)
        finally:
            _CURRENT.reset(token)
        d.begin_attempt()
        try:
            return await task
        except StepError as exc:  # anything the step raised, as perform() made it
            return exc
        finally:
            d.end_attempt()

    async def _wait(
        self,
        name: str,
        data: dict[str, Any],
        make: Callable[[str, int], Awaitable[dict[str, Any]]],
    ) -> Any:
        d = self._d
        _not_nested(name)
        step, entry = d.claim(name)
        if d.must_stop():
            await d.stopped()
        if isinstance(entry, Replay):
            return entry.output
        if isinstance(entry, Raise):
            raise FailedStep(step, entry.error)
        assert not isinstance(entry, Nondeterminism)  # claim() has stopped the function
        if isinstance(entry, Parked):
            wait = entry.wait
        else:
            drafts: list[Draft] = []
            attempt = entry.attempt
            if isinstance(entry, Attempt) and entry.start:
                drafts.append((ev.STEP_STARTED, data, step, attempt))
            if data["type"] == "subagent":  # the start is durable before the child exists
                await d.emit(drafts)
                drafts = []
                await d.durable()
                d.check_live()
            try:
                wait = await make(step, attempt)
            except StepError as exc:
                error = exc.to_json()
                await d.emit([*drafts, (ev.STEP_FAILED, {"error": error}, step, attempt)])
                await d.durable()
                raise FailedStep(step, error) from None
            await d.emit([*drafts, (ev.STEP_WAITING, wait, step, attempt)])
            await d.durable()
        found = await resolved(d.host.store, d.ledger, step, wait)
        if found is None:
            d.parked[step] = wait
            d.halt.set()
            await d.stopped()
        assert found is not None
        done = d.ledger.resumed(step, *found)
        if isinstance(done.next, Completed):
            d.pending.extend(done.events[:-1])
            d.add(done.events[-1])
            await d.notice(done.events[:-1])
            return done.next.output
        assert isinstance(done.next, Failed)  # a wait is never retried
        d.pending.extend(done.events)
        await d.notice(done.events)
        await d.durable()
        raise FailedStep(step, done.next.error.to_json())


class _Steps:
    """How a function's step journals its attempts (``drive.attempts``): a start goes with
    what is pending, made durable before the step runs; an outcome's events are queued for
    the next commit (a completion rides with the next step's start)."""

    __slots__ = ("ctx", "data", "limit", "policy", "step", "usage", "work")

    def __init__(
        self,
        ctx: EngineContext,
        step: str,
        data: dict[str, Any],
        work: Callable[[_Attempt], Awaitable[Any]],
        policy: RetryPolicy,
        limit: float | None,
        usage: Usage,
    ) -> None:
        self.ctx, self.step, self.data, self.work = ctx, step, data, work
        self.policy, self.limit, self.usage = policy, limit, usage

    async def backoff(self, due_ms: int) -> bool:
        d = self.ctx._d
        if d.ledger.parks(self.step, due_ms):
            # A rate limit's wait holds no slot and no lease: the function is stopped (the
            # steps running finish) and the run parks until it is due, as at a ctx.sleep.
            d.throttled = True
            d.halt.set()
            await d.stopped()
        await d.backoff(due_ms, d.halt)
        if d.must_stop():
            await d.stopped()
        return True

    async def ready(self, attempt: int, start: bool) -> None:
        d = self.ctx._d
        if start:
            await d.emit([(ev.STEP_STARTED, self.data, self.step, attempt)])
        await d.durable()
        if d.must_stop():
            await d.stopped()
        d.check_live()

    async def attempt(self, attempt: int) -> Any:
        return await self.ctx._attempt(self.step, attempt, self.work, self.limit)

    async def settled(self, attempt: int, outcome: Any) -> Exit:
        d = self.ctx._d
        done = d.settle(self.step, attempt, outcome, self.policy, self.usage)
        if isinstance(done.next, Completed):
            d.add(done.events[-1])  # durable with the next commit, soon
        else:
            d.pending.extend(done.events)
        await d.notice(done.events)  # a cost or token spike, a retry storm
        return done


def _not_nested(name: str) -> None:
    current = _CURRENT.get()
    if current is not None:
        raise UsageError(
            f"ctx call {name!r} inside the step {current.step!r}: steps do not nest;"
            " call the function directly"
        )


def _tool_context(d: FunctionRun, a: _Attempt) -> ToolContext:
    return ToolContext(d.run.id, a.step, a.attempt, a.key, a.deliveries.once, d.run.workspace)


async def _call(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    if inspect.iscoroutinefunction(fn):
        result = await fn(*args, **kwargs)
    else:
        # A sync function must not block the event loop that journals every other run.
        result = await asyncio.to_thread(fn, *args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


def _timeout_ms(timeout_s: Any, call: str) -> int | None:
    """A wait's ``timeout_s`` (seconds, None: no timeout) in milliseconds, checked."""
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
        raise UsageError(f"{call}: timeout_s must be a positive number of seconds")
    return max(1, round(timeout_s * 1000))


def _limit(timeout_ms: Any, name: str) -> float | None:
    if timeout_ms is None:
        return None
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms <= 0:
        raise UsageError(f"{name!r}: timeout_ms must be a positive integer")
    return timeout_ms / 1000


class BlockingContext:
    """The Context of a plain ``def`` agent: the same calls, each blocking its thread until
    the engine's event loop has done it."""

    def __init__(self, ctx: EngineContext, loop: asyncio.AbstractEventLoop) -> None:
        self._ctx = ctx
        self._loop = loop
        self._futures: set[concurrent.futures.Future[Any]] = set()
        self._aborted = False
        self._lock = threading.Lock()

    def abort(self) -> None:
        """The drive stops the function: every blocked call raises CancelledError."""
        with self._lock:
            self._aborted = True
            for f in self._futures:
                f.cancel()

    def _do(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        if _on_loop(self._loop):
            raise UsageError("a blocking ctx call was made on the event loop; await ctx instead")
        current = _CURRENT.get()  # the step this thread is in, for the loop's side

        async def as_here() -> T:
            _CURRENT.set(current)
            return await make()

        with self._lock:
            if self._aborted:
                raise concurrent.futures.CancelledError()
            future = asyncio.run_coroutine_threadsafe(as_here(), self._loop)
            self._futures.add(future)
        try:
            return future.result()
        finally:
            with self._lock:
                self._futures.discard(future)

    @property
    def run_id(self) -> str:
        return self._ctx.run_id

    @property
    def step_id(self) -> str:
        return self._ctx.step_id

    @property
    def attempt(self) -> int:
        return self._ctx.attempt

    @property
    def idempotency_key(self) -> str:
        return self._ctx.idempotency_key

    def key_for(self, name: str) -> str:
        return self._ctx.key_for(name)

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return self._do(lambda: self._ctx.step(name, fn, *args, **kwargs))

    def model(self, model: str, **kwargs: Any) -> ModelReply:
        return self._do(lambda: self._ctx.model(model, **kwargs))

    def tool(self, name: str, /, **args: Any) -> Any:
        return self._do(lambda: self._ctx.tool(name, **args))

    def sleep(self, name: str, *, seconds: float) -> None:
        self._do(lambda: self._ctx.sleep(name, seconds=seconds))

    def sleep_until(self, name: str, when: datetime) -> None:
        self._do(lambda: self._ctx.sleep_until(name, when))

    def approval(self, name: str, **kwargs: Any) -> Approval:
        return self._do(lambda: self._ctx.approval(name, **kwargs))

    def run_agent(self, name: str, input: Any) -> Any:
        return self._do(lambda: self._ctx.run_agent(name, input))

    def wait_for_signal(self, name: str, *, timeout_s: float | None = None) -> Any:
        return self._do(lambda: self._ctx.wait_for_signal(name, timeout_s=timeout_s))

    def deliver_once(self, name: str, fn: Callable[[], Any], *, to: str | None = None) -> Any:
        return self._do(lambda: self._ctx.deliver_once(name, fn, to=to))


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
