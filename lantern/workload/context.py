"""The Context a workload receives inside a VM: the method names of ``lantern.Context``.

Every ``ctx.step`` is reported to the runtime node as ``step_started`` then
``step_completed`` (with its output) or ``step_failed``, and the node relays each report to
the control plane, which journals it. A resumed VM (``LANTERN_RESUME=1``) is handed the
run's completed steps first: a step that has a journaled output returns it and its function
is not called, so a workload skips its own completed work without code of its own.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import inspect
import json
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

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
    """A step of this run failed before (journaled): a resumed workload sees it again."""


class Unsupported(Exception):
    """A Context method that needs the control plane's own machinery (a model provider, a
    parked run) and is not offered inside a VM yet."""


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
    ) -> None:
        self._channel = channel
        self.run_id = run_id
        self._completed = dict(completed or {})
        self._seen: dict[str, int] = {}

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
        return hashlib.sha256(f"{self.idempotency_key}|{name}".encode()).hexdigest()

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
        step_id = self._name(name)
        if step_id in self._completed:
            return self._completed[step_id]
        policy = dict(retry or {})
        attempts = max(1, int(policy.get("maxAttempts", 1)))
        backoff = max(0, int(policy.get("backoffMs", 0))) / 1000
        attempt = 1
        self._report({"kind": "step_started", "stepId": step_id, "attempt": 1})
        while True:
            token = _current_step.set((step_id, attempt))
            try:
                output = await self._invoke(fn, args, kwargs, timeout_ms)
                encoded = json.loads(json.dumps(output))  # what a replay would read back
            except Exception as exc:
                error = _error(exc, step_id, timeout_ms)
                if attempt < attempts:
                    attempt += 1
                    data = {"attempt": attempt, "of": attempts, "error": error}
                    self._report(
                        {
                            "kind": "step_retrying",
                            "stepId": step_id,
                            "attempt": attempt,
                            "data": data,
                        }
                    )
                    await asyncio.sleep(backoff * 2 ** (attempt - 2))
                    continue
                self._report(
                    {
                        "kind": "step_failed",
                        "stepId": step_id,
                        "attempt": attempt,
                        "data": {"error": error},
                    }
                )
                raise
            finally:
                _current_step.reset(token)
            self._report(
                {"kind": "step_completed", "stepId": step_id, "attempt": attempt, "output": encoded}
            )
            self._completed[step_id] = encoded
            return encoded

    async def deliver_once(self, name: str, dispatch: Callable[[], Any]) -> Any:
        """A delivery made at most once per run: a step of its own, named ``name``."""
        return await self.step(name, dispatch)

    async def sleep(self, name: str, *, seconds: float) -> None:
        """A timer step. Inside a VM it sleeps in place (the VM keeps running): a resumed VM
        whose timer had completed does not sleep again."""
        await self.step(name, asyncio.sleep, seconds)

    async def sleep_until(self, name: str, when: datetime) -> None:
        """``sleep`` until an aware ``datetime``."""
        await self.step(name, _sleep_until, when.timestamp())

    async def model(self, *args: Any, **kwargs: Any) -> Any:
        raise Unsupported("ctx.model is not available inside a microVM workload yet")

    async def approval(self, *args: Any, **kwargs: Any) -> Any:
        raise Unsupported("ctx.approval is not available inside a microVM workload yet")

    async def run_agent(self, *args: Any, **kwargs: Any) -> Any:
        raise Unsupported("ctx.run_agent is not available inside a microVM workload yet")

    async def tool(self, *args: Any, **kwargs: Any) -> Any:
        raise Unsupported("ctx.tool is not available inside a microVM workload yet")

    # -- inside ----------------------------------------------------------------------------

    def _name(self, name: str) -> str:
        count = self._seen.get(name, 0) + 1
        self._seen[name] = count
        return name if count == 1 else f"{name}#{count}"

    def _report(self, event: dict[str, Any]) -> None:
        self._channel.ask("report", events=[event])

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


def _sleep_until(at: float) -> None:
    time.sleep(max(0.0, at - time.time()))


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


def _error(exc: BaseException, step_id: str, timeout_ms: int | None) -> dict[str, Any]:
    if isinstance(exc, TimeoutError) and timeout_ms is not None:
        message = f"step {step_id!r} timed out after {timeout_ms} ms"
        return {"message": message, "class": "timeout", "retryable": True}
    message = f"{type(exc).__name__}: {exc}"
    return {"message": message, "class": "tool", "retryable": True}
