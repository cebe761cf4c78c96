"""The user's side of Lantern: an ``App`` holding tools, loaded with ``--app MODULE:OBJECT``."""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints

from lantern import threads
from lantern.errors import UsageError
from lantern.store.records import NewEvent

F = TypeVar("F", bound=Callable[..., Any])
CommitListener = Callable[[str, Sequence[NewEvent]], None]


DeliverOnce = Callable[[str, Callable[[], Any]], Awaitable[Any]]


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the step it runs in; ``idempotency_key`` is stable per attempt."""

    run_id: str
    step_id: str
    attempt: int
    idempotency_key: str
    _deliver: DeliverOnce | None = None

    async def deliver_once(self, name: str, dispatch: Callable[[], Any]) -> Any:
        """Make the delivery ``name`` (a payment, a ticket, a post) at most once per step.

        ``dispatch`` (sync or async) is called only if this step has not delivered ``name``
        before; a re-drive gets the recorded answer back instead. Pass
        ``ctx.idempotency_key`` (or ``ctx.key_for(name)`` when one receiver gets several
        deliveries of this step) to receivers that de-duplicate.
        """
        if self._deliver is None:
            raise UsageError("deliver_once needs a step run by Lantern's engine")
        return await self._deliver(name, dispatch)

    def key_for(self, name: str) -> str:
        """An idempotency key of its own for the delivery ``name`` of this step attempt."""
        return hashlib.sha256(f"{self.idempotency_key}|{name}".encode()).hexdigest()


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    description: str
    context_param: str | None

    @property
    def interruptible(self) -> bool:
        """An async tool is cancelled at once; a sync one runs in a thread, which cannot be."""
        return inspect.iscoroutinefunction(self.fn)

    async def call(self, context: ToolContext, args: dict[str, Any]) -> Any:
        kwargs = dict(args)
        if self.context_param is not None:
            kwargs[self.context_param] = context
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**kwargs)
        # A sync tool must not block the event loop that journals every other run, nor the
        # default executor's threads that DNS lookups use: it gets a bounded pool of its own.
        return await threads.run_sync(self.fn, **kwargs)


class App:
    """A registry of the user's tools and of observers of journal commits."""

    def __init__(self) -> None:
        self.tools: dict[str, Tool] = {}
        self.commit_listeners: list[CommitListener] = []

    def tool(self, name: str | None = None) -> Callable[[F], F]:
        def register(fn: F) -> F:
            tool_name = name or fn.__name__
            if tool_name in self.tools:
                raise UsageError(f"tool {tool_name!r} is registered twice")
            self.tools[tool_name] = Tool(
                tool_name, fn, inspect.getdoc(fn) or "", _context_param(fn)
            )
            return fn

        return register

    def on_commit(self, listener: CommitListener) -> CommitListener:
        """Call ``listener(run_id, events)`` after each journal commit of this process."""
        self.commit_listeners.append(listener)
        return listener


def _context_param(fn: Callable[..., Any]) -> str | None:
    try:
        hints = get_type_hints(fn)
    except Exception:  # unresolvable annotations: fall back to the raw ones
        hints = dict(getattr(fn, "__annotations__", {}))
    for param, hint in hints.items():
        if hint is ToolContext or hint == "ToolContext" or hint == "lantern.ToolContext":
            return param
    return None


def load_app(spec: str | None) -> App:
    """Import ``MODULE:OBJECT`` (or ``MODULE``, taking its ``app``); None gives an empty App."""
    if not spec:
        return App()
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import --app module {module_name!r}: {exc}") from exc
    obj = getattr(module, attr or "app", None)
    if not isinstance(obj, App):
        raise UsageError(f"--app {spec!r} does not name a lantern.App")
    return obj
