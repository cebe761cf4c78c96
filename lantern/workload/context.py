"""The Context a workload receives inside a VM: the methods of ``lantern.Context``.

The harness proposes, the control plane decides. A ``ctx.step`` asks (``step``, relayed by the
runtime node to ``POST /v1/runtime/step``) which attempt to run: the answer is the journaled
output (the step is not run again), its journaled failure, a retry's due time to wait for, or
the attempt to run now. The harness runs it and sends what it did, ``{stepId, position,
attempt, output}`` or ``{..., error: {message, class, retryable}}``; the control plane journals
it through the same step ledger as every kind of run and answers: go on, retry (its due time
journaled with ``step_retrying``), or fail. The harness keeps no retry loop of its own. Each
call carries its position, so the control plane checks a resumed workload's step names
against the journal's order (a different name there fails the run with ``nondeterminism``).
A resumed VM (``LANTERN_RESUME=1``) is also handed the run's completed steps first.

``ctx.model`` and ``ctx.tool`` cross the channel: the VM has no network and no keys, so the
control plane performs the model call (with its provider keys, through its model layer) or
runs the tool registered on its ``App``, as a journaled step, and answers with the step's
output; a model call a rate limit holds back is answered with its journaled due time
(``{dueAt, attempt}``), and the VM waits for it before asking again, the channel free meanwhile.
``ctx.approval``, ``ctx.run_agent``, ``ctx.sleep`` and ``ctx.wait_for_signal`` cross it
too: the control plane journals the wait as for an in-process agent and answers when it
resolves; the VM waits for the answer where an in-process run would park.
Inside a step of its own, ``ctx.deliver_once`` is claimed and recorded by the control plane
around the dispatch the VM makes, and ``ctx.live_text`` passes a model's text to the run's
followers through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import inspect
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from lantern.workload.channel import ChannelError
from lantern.workload.replies import Approval, ModelReply, key_for

# What the control plane answers a call that is itself wrong (422: a tool or model it does not
# have, bad arguments; 413: too large). Asked again, it gets the same answer: the workload's
# error, not a lost VM to resume.
REFUSED = (413, 422)

_RESUMED = False
_current_step: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar(
    "lantern_workload_step", default=None
)


def resumed() -> bool:
    """True in a VM that resumes a run another VM began (``LANTERN_RESUME=1``)."""
    return _RESUMED


def _set_resumed(value: bool) -> None:
    global _RESUMED
    _RESUMED = value


class Reporter(Protocol):
    def ask(self, op: str, **fields: Any) -> Any: ...


class StepFailed(Exception):
    """A step failed for good (journaled ``step_failed``): a model call or a tool the control
    plane performed, or a step of this run that failed before. ``error`` is the journaled
    error; uncaught, it is the run's error (``step_failed``, or its own code such as
    ``budget_exceeded``), as in-process."""

    def __init__(self, step_id: str, error: Mapping[str, Any]) -> None:
        super().__init__(f"step {step_id!r} failed: {error.get('message', error)}")
        self.step_id = step_id
        self.error = dict(error)


class CallRefused(Exception):
    """The control plane refused a ``ctx.model``, ``ctx.tool`` or wait as bad input (a tool or
    model it does not have, arguments it cannot take); nothing was journaled. Uncaught, the run
    fails with it, as the same call in-process raises ``lantern.UsageError``."""


class Unsupported(Exception):
    """A Context property read where it means nothing (``idempotency_key`` outside a step)."""


def idempotency_key(run_id: str, step_id: str, attempt: int) -> str:
    return hashlib.sha256(f"{run_id}|{step_id}|{attempt}".encode()).hexdigest()


class Context:
    """``ctx`` inside a VM. ``run_id`` and ``attempt`` hold for the whole workload;
    ``step_id`` and ``idempotency_key`` are those of the step running now."""

    def __init__(
        self,
        channel: Reporter,
        run_id: str,
        completed: Mapping[str, Any] | None = None,
        order: Sequence[str] = (),
    ) -> None:
        self._channel = channel
        self.run_id = run_id
        self._completed = dict(completed or {})
        self._order = list(order)  # the journal's step ids, in the order they were started
        self._seen: dict[str, int] = {}
        self.calls = 0  # ctx calls made so far: a call's position is its number

    # -- what a step may know ------------------------------------------------------------

    @property
    def step_id(self) -> str | None:
        current = _current_step.get()
        return None if current is None else current[0]

    @property
    def attempt(self) -> int:
        current = _current_step.get()
        return 1 if current is None else current[1]

    @property
    def idempotency_key(self) -> str:
        current = _current_step.get()
        if current is None:
            raise Unsupported("idempotency_key is the key of a step: read it inside ctx.step")
        return idempotency_key(self.run_id, *current)

    def key_for(self, name: str) -> str:
        return key_for(self.idempotency_key, name)

    # -- steps ---------------------------------------------------------------------------

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
        """Run ``fn(*args, **kwargs)`` (sync or async) once for this run; its output is
        journaled and a resumed VM gets it back without calling ``fn``."""
        step_id, position = self._name(name)
        if self._served(step_id, position):
            return self._completed[step_id]
        ask = {"stepId": step_id, "position": position}
        if retry is not None:
            ask["retry"] = dict(retry)
        while True:
            # Which attempt to run (and when): the control plane decides, from the journal.
            answer = self._step(ask)
            if "output" in answer:  # the journal has it: not run again
                self._completed[step_id] = answer["output"]
                return answer["output"]
            if "error" in answer:
                raise StepFailed(step_id, answer["error"])
            if "dueAt" in answer:  # a retry's backoff, journaled: wait it out, then ask again
                await asyncio.sleep(max(0.0, answer["dueAt"] / 1000 - time.time()))
                continue
            attempt = int(answer["attempt"])
            raised: BaseException | None = None
            proposal: dict[str, Any]
            token = _current_step.set((step_id, attempt))
            try:
                output = await self._invoke(fn, args, kwargs, timeout_ms)
            except Exception as exc:
                raised = exc
                proposal = {"error": _error(exc, step_id, timeout_ms)}
            else:
                proposal = _encoded(step_id, output)
            finally:
                _current_step.reset(token)
            # What the attempt did; the answer says what follows: go on, retry, or fail.
            decision = self._step({**ask, "attempt": attempt, **proposal})
            if "output" in decision:
                self._completed[step_id] = decision["output"]
                return decision["output"]
            if "retry" in decision:
                continue
            if raised is not None:
                raise raised  # the workload sees its own exception, as in-process
            raise StepFailed(step_id, decision["error"])

    async def deliver_once(
        self, name: str, dispatch: Callable[[], Any], *, to: str | None = None
    ) -> Any:
        """Make the delivery ``name`` at most once: inside a step, a claimed delivery of that
        step (as for tools); between steps, a step of its own named ``name``. The control plane
        claims it before ``dispatch`` (sync or async) runs here and records what came back, so
        a resumed VM gets the answer without dispatching again; the run's deliveries list it
        with kind ``code`` and ``to``, as in-process."""
        if _current_step.get() is not None:
            return await self._claimed(name, dispatch, to)

        async def once() -> Any:
            return await self._claimed(name, dispatch, to)

        return await self.step(name, once)

    @contextlib.contextmanager
    def live_text(self) -> Iterator[Callable[[str], None] | None]:
        """Inside a step: where a model's text goes, piece by piece, to whoever follows the
        run (``event: delta``), through the control plane; never journaled, and a retried
        attempt's text replaces the failed one's. ``None`` when nobody follows the run, so the
        caller need not stream."""
        current = _current_step.get()
        if current is None:
            raise Unsupported("live_text is the text of a step: use it inside ctx.step")
        step, attempt = current

        def send(**fields: Any) -> bool:
            call = {"kind": "live", "attempt": attempt, **fields}
            answer = self._channel.ask("call", stepId=step, position=0, call=call)
            return bool(answer.get("following"))

        following = send(text="")

        def on_text(text: str) -> None:
            if text:
                send(text=text)

        try:
            yield on_text if following else None
        finally:
            if following:
                send(done=True)

    async def sleep(self, name: str, *, seconds: float) -> None:
        """A durable timer: its due time is journaled, so a VM resumed mid-sleep waits out
        the rest only, and one resumed after it does not sleep again. The VM waits (holding
        its slot) where an in-process run would park."""
        await self._remote(name, {"kind": "sleep", "seconds": seconds})

    async def sleep_until(self, name: str, when: datetime) -> None:
        """``sleep`` until an aware ``datetime``."""
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise ValueError(f"ctx.sleep_until({name!r}): when must be an aware datetime")
        await self._remote(name, {"kind": "sleep", "dueAt": int(when.timestamp() * 1000)})

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
        """A model step, performed by the control plane (its keys, its model layer); tools
        named here are those registered on the control plane's App."""
        request = {
            "kind": "model",
            "model": model,
            "prompt": prompt,
            "system": system,
            "messages": [dict(m) for m in messages or ()],
            "tools": [t if isinstance(t, str) else dict(t) for t in tools or ()],
            "temperature": temperature,
            "maxTokens": max_tokens,
            "retry": None if retry is None else dict(retry),
        }
        return ModelReply.from_json(await self._remote(name, request))

    async def tool(self, name: str, /, **args: Any) -> Any:
        """A tool registered on the control plane's App, run there as a step."""
        return await self._remote(name, {"kind": "tool", "tool": name, "args": args})

    async def approval(
        self,
        name: str,
        *,
        prompt: str = "",
        assignees: Sequence[str] = (),
        timeout_ms: int | None = None,
        on_timeout: str = "reject",
    ) -> Approval:
        """Wait for a decision (``POST /v1/runs/{id}/approvals/{name}``), or the timeout's.
        The VM waits for it where an in-process run would park."""
        request = {
            "kind": "approval",
            "prompt": prompt,
            "assignees": list(assignees),
            "timeoutMs": timeout_ms,
            "onTimeout": on_timeout,
        }
        return Approval.from_json(await self._remote(name, request))

    async def wait_for_signal(self, name: str, *, timeout_s: float | None = None) -> Any:
        """Wait for the signal ``name`` (``POST /v1/runs/{id}/signals/{name}``) and return its
        payload, or None after ``timeout_s`` seconds. The control plane journals the wait and
        decides which signal it takes; the VM waits for it where an in-process run would park."""
        if timeout_s is not None and (
            isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0
        ):
            raise ValueError(f"ctx.wait_for_signal({name!r}): timeout_s must be a positive number")
        limit = None if timeout_s is None else max(1, round(timeout_s * 1000))
        return await self._remote(name, {"kind": "signal", "name": name, "timeoutMs": limit})

    async def run_agent(self, name: str, input: Any) -> Any:
        """Start the agent ``name`` as a child run (a deterministic id) and wait for its end:
        its output, or ``StepFailed`` when it did not succeed."""
        return await self._remote(name, {"kind": "run_agent", "agentName": name, "input": input})

    # -- inside ----------------------------------------------------------------------------

    def _name(self, name: str) -> tuple[str, int]:
        """The call's step id (``name``, ``name#2``, ...) and its 1-based position."""
        count = self._seen.get(name, 0) + 1
        self._seen[name] = count
        self.calls += 1
        return (name if count == 1 else f"{name}#{count}"), self.calls

    def _unname(self, name: str, position: int) -> None:
        """Give back the position of a refused call, which journaled nothing: in-process a
        refused call never takes one, and a resumed VM's calls are checked against the
        journal's positions. Only the call numbered last can give its position back."""
        if self.calls == position:
            self.calls -= 1
            self._seen[name] -= 1

    def _served(self, step_id: str, position: int) -> bool:
        """Whether the journal answers this call: its step completed at this very position
        (at another, the control plane fails the run when the call is reported)."""
        if step_id not in self._completed:
            return False
        return not self._order or (
            position <= len(self._order) and self._order[position - 1] == step_id
        )

    async def _remote(self, name: str, request: dict[str, Any]) -> Any:
        """A step the control plane performs: the journal's output when it has one, else the
        answer to ``call`` (it journals the step itself); ``StepFailed`` when it failed."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"ctx.{request['kind']}: the step name must be a non-empty string")
        step_id, position = self._name(name)
        if self._served(step_id, position):
            return self._completed[step_id]
        # On a thread: a model call or a wait takes a while, and the workload's other tasks
        # (pure computation; steps' reports wait for the channel) go on meanwhile.
        while True:
            try:
                answer = await asyncio.to_thread(
                    self._channel.ask, "call", stepId=step_id, position=position, call=request
                )
            except ChannelError as exc:
                if exc.status in REFUSED:
                    self._unname(name, position)
                    raise CallRefused(str(exc)) from None
                raise
            if "dueAt" not in answer:
                break
            # A rate limit holds the call back until its journaled due time: wait here, the
            # channel free for the workload's other tasks, then ask again.
            await asyncio.sleep(max(0.0, answer["dueAt"] / 1000 - time.time()))
        if "error" in answer:
            raise StepFailed(step_id, answer["error"])
        self._completed[step_id] = answer["output"]
        return answer["output"]

    async def _claimed(self, name: str, dispatch: Callable[[], Any], to: str | None) -> Any:
        """A delivery of the step running now, claimed and recorded by the control plane."""
        step, attempt = _current_step.get() or ("", 0)
        ask = {"kind": "deliver", "attempt": attempt, "name": name, "to": to}
        claimed = await self._in_step(step, {**ask, "phase": "claim"})
        if claimed["delivered"]:  # delivered before (a resumed VM, a retried attempt)
            return claimed["response"]
        try:
            answer = dispatch()
            if inspect.isawaitable(answer):
                answer = await answer
        except Exception as exc:
            error = {"message": f"{type(exc).__name__}: {exc}"}
            await self._in_step(step, {**ask, "phase": "finish", "error": error})
            raise
        encoded = _encoded(step, answer)
        done = await self._in_step(step, {**ask, "phase": "finish", **encoded})
        if "error" in encoded:  # it went out; what came back cannot be kept
            raise ValueError(encoded["error"]["message"])
        return done["response"]

    async def _in_step(self, step: str, call: dict[str, Any]) -> Any:
        try:
            return await asyncio.to_thread(
                self._channel.ask, "call", stepId=step, position=0, call=call
            )
        except ChannelError as exc:
            if exc.status in REFUSED:
                raise CallRefused(str(exc)) from None
            raise

    def _step(self, fields: dict[str, Any]) -> Any:
        # On the event loop's own thread, as the step's call order: a resumed workload's
        # positions are checked against the journal's order.
        try:
            return self._channel.ask("step", **fields)
        except ChannelError as exc:
            if exc.status in REFUSED:  # a retry policy it cannot take, say: nothing journaled
                raise CallRefused(str(exc)) from None
            raise

    async def _invoke(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout_ms: int | None,
    ) -> Any:
        started = time.monotonic()
        if inspect.iscoroutinefunction(fn):
            work = fn(*args, **kwargs)
        else:
            work = asyncio.to_thread(fn, *args, **kwargs)  # carries the step's context
        if timeout_ms is None:
            result = await work
        else:
            result = await asyncio.wait_for(work, timeout_ms / 1000)
        if inspect.isawaitable(result):  # a plain def that returned a coroutine
            remaining = (
                None if timeout_ms is None else timeout_ms / 1000 - (time.monotonic() - started)
            )
            result = await asyncio.wait_for(result, remaining)
        return result


class BlockingContext:
    """What a plain ``def`` workload receives: the same methods, returning their values."""

    def __init__(self, inner: Context) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(found):
            return found

        def call(*args: Any, **kwargs: Any) -> Any:
            return asyncio.run(found(*args, **kwargs))

        return call

    def key_for(self, name: str) -> str:
        return self._inner.key_for(name)


def _encoded(step_id: str, output: Any) -> dict[str, Any]:
    """The output as a replay would read it back, or why it cannot be journaled."""
    try:
        return {"output": json.loads(json.dumps(output))}
    except (TypeError, ValueError) as exc:
        message = f"step {step_id!r} returned a value the journal cannot store: {exc}"
        return {"error": {"message": message, "class": "tool", "retryable": False}}


def _error(exc: BaseException, step_id: str, timeout_ms: int | None) -> dict[str, Any]:
    if isinstance(exc, TimeoutError) and timeout_ms is not None:
        message = f"step {step_id!r} timed out after {timeout_ms} ms"
        return {"message": message, "class": "timeout", "retryable": True}
    message = f"{type(exc).__name__}: {exc}"
    return {"message": message, "class": "tool", "retryable": True}
