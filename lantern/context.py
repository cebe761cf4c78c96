"""``lantern.Context``: what a code-first agent's function receives (its calls are steps).

Apart from ``lantern.app`` so that what wraps a user's agent (``lantern.integrations``) can
know the Context without importing the App, which registers those integrations.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from lantern.workload.replies import Approval, ModelReply, key_for


class Context(abc.ABC):
    """What a code-first agent's function receives: every call below is a journaled step.

    A step that completed before a crash returns its journaled output and is not run again;
    the step in flight at a crash runs again with the same attempt and so the same
    ``idempotency_key``. A step's id is its name; the same name again in one run gets
    ``name#2``, ``name#3``, ... in call order. The code between steps must be deterministic:
    on a re-drive the step names are checked against the journal in order, and a different
    name at a position fails the run with error code ``nondeterminism``.

    ``run_id`` is the run's; ``step_id``, ``attempt`` and ``idempotency_key`` are the step's
    whose function is running (read them inside a ``step`` function), as for tools.
    """

    @property
    @abc.abstractmethod
    def run_id(self) -> str: ...

    @property
    @abc.abstractmethod
    def step_id(self) -> str: ...

    @property
    @abc.abstractmethod
    def attempt(self) -> int: ...

    @property
    @abc.abstractmethod
    def idempotency_key(self) -> str: ...

    @abc.abstractmethod
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
        """Run ``fn(*args, **kwargs)`` (sync or async) once as the step ``name``; its return
        value (JSON) is journaled and returned, now and on every replay. ``retry`` is a node's
        retry policy (``{"maxAttempts", "backoffMs", "retryableClasses"}``)."""

    @abc.abstractmethod
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
        """One model call as a step (routed, budgeted, keyed), named ``name`` (default
        ``model``). ``messages`` are ``{role, content}`` (``user``, ``assistant``, ``tool``)
        after ``prompt``; ``tools`` are registered tool names or ``{name, description,
        parameters}`` specs; the reply's ``tool_calls`` are what the model asked for."""

    @abc.abstractmethod
    async def tool(self, name: str, /, **args: Any) -> Any:
        """Call the registered tool ``name`` with ``args`` as a step (its id is ``name``)."""

    @abc.abstractmethod
    async def sleep(self, name: str, *, seconds: float) -> None:
        """A durable timer: the run parks holding no lease and wakes when it is due, on any
        replica; the due time is journaled, so a crash does not restart the wait."""

    @abc.abstractmethod
    async def sleep_until(self, name: str, when: datetime) -> None:
        """``sleep`` until an aware ``datetime``."""

    @abc.abstractmethod
    async def approval(
        self,
        name: str,
        *,
        prompt: str = "",
        assignees: Sequence[str] = (),
        timeout_ms: int | None = None,
        on_timeout: str = "reject",
    ) -> Approval:
        """Park until ``POST /v1/runs/{id}/approvals/{name}`` decides (or the timeout does)."""

    @abc.abstractmethod
    async def wait_for_signal(self, name: str, *, timeout_s: float | None = None) -> Any:
        """Park until the signal ``name`` is sent to this run (``POST
        /v1/runs/{id}/signals/{name}``) and return its payload; None once ``timeout_s``
        seconds have passed without one (journaled). A signal sent before the wait is kept for
        it; several are taken one per wait, in the order they were received. The step's id is
        ``name`` (``name#2`` for the next wait for it)."""

    @abc.abstractmethod
    async def run_agent(self, name: str, input: Any) -> Any:
        """Start the agent ``name`` as a child run (its id is derived from this run and step,
        so a re-drive finds the same child) and park until it ends; its output is returned,
        its failure raises ``StepError``."""

    @abc.abstractmethod
    async def deliver_once(self, name: str, fn: Callable[[], Any], *, to: str | None = None) -> Any:
        """Make the delivery ``name`` at most once: inside a step, a claimed delivery of that
        step (as for tools); between steps, a step of its own named ``name``. ``fn`` may be
        sync or async. The run's deliveries list it with kind ``code`` and ``to`` (where it
        goes: a URL, an address), when given."""

    def key_for(self, name: str) -> str:
        """An idempotency key of its own for the delivery ``name`` of this step attempt."""
        return key_for(self.idempotency_key, name)

    @contextlib.contextmanager
    def live_text(self) -> Iterator[Callable[[str], None] | None]:
        """Inside a step: where a model's text goes, piece by piece, as it is generated, to
        whoever follows the run (``event: delta``); never journaled, and a retried attempt's
        text replaces the failed one's, as for ``ctx.model``. ``None`` when nobody follows the
        run here, so the caller need not stream. For what wraps another framework's model
        (``lantern.integrations``); a Context that cannot stream yields ``None``."""
        yield None
