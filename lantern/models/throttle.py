"""Rate limits on model calls (docs/rate-limits.md): reserve before a call, settle after it.

A limit counts what the calls to the models it matches reserve, in slots of ``SLOT_MS``. A
call is admitted when what the slots of the last ``SLOTS`` (the window and a slot more: 61 s
for the default minute) hold plus the call stays within the limit, so over ANY 60 s the tokens
and requests sent stay within it. A plain
token bucket of the same size would not: a full bucket spent at once and refilled over the
next minute lets twice the limit through in that minute. A refused call learns when the
oldest slots will have left the window enough to admit it: the step waits that long
(``Throttled``, journaled ``step_throttled``) and asks again.

A call reserves its estimated prompt tokens plus its ``maxTokens`` (``budget.estimate``) and
one request in the slot of the reservation; once the provider answers, the reservation moves
to the slot of the answer, settled to the usage it reports (or, when it failed, to no tokens:
the request still counts). The provider saw the request somewhere between the two, so a call
counts from before it could arrive until a minute after it surely had (a slow first request,
or a queue before the provider, cannot slip it out of the window early). Every change to a
limit's window is one UPDATE conditional on the version read (``ModelLimitStore.swap_window``),
so replicas sharing the database share the limit.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from lantern.config import rate_limit_window
from lantern.errors import StepError, Throttled
from lantern.models import offline
from lantern.store.model_limits import SERVER, ModelLimit, ModelLimitStore, Slot

# A slot is a sixtieth of the window: 1 s for the default minute (LANTERN_RATE_LIMIT_WINDOW,
# read once: slot indexes are stored, so a process never changes its slot length).
SLOT_MS = max(1, round(rate_limit_window() * 1000 / 60))
# Slots a check counts: the current one and the 61 before it, the window and a slot more, so a
# minute of the provider's clock is covered even when a request reaches it a little after its
# reservation.
SLOTS = 62
SWAPS = 20  # conditional writes tried before a busy limit counts as throttling
BUSY_WAIT_MS = 200
# How old the list of limits a call checks may be: every model call asks and most find none, so
# the list is read once a second per workspace, not once a call. A limit set or deleted applies
# at once on the replica that took the request (``definitions.forget``), within this on others.
DEFINITIONS_TTL_S = 1.0


def slot_of(now_ms: int) -> int:
    return now_ms // SLOT_MS


def live(window: Sequence[Slot], current: int) -> tuple[Slot, ...]:
    """The slots a check at slot ``current`` counts (older ones have left the window)."""
    return tuple(s for s in window if s.index > current - SLOTS)


def used(limit: ModelLimit, now_ms: int) -> dict[str, int]:
    """What the window a call made now is checked against holds: the tokens and requests
    reserved or spent in the limit's last minute (``GET /v1/limits`` shows it as ``used``)."""
    slots = live(limit.window, slot_of(now_ms))
    return {"tokens": sum(s.tokens for s in slots), "requests": sum(s.requests for s in slots)}


def _fits(limit: ModelLimit, slots: Sequence[Slot], tokens: int) -> bool:
    if limit.tokens_per_minute is not None:
        if sum(s.tokens for s in slots) + tokens > limit.tokens_per_minute:
            return False
    if limit.requests_per_minute is not None:
        if sum(s.requests for s in slots) + 1 > limit.requests_per_minute:
            return False
    return True


def too_large(limit: ModelLimit, model: str, tokens: int) -> StepError | None:
    """A call that no window could ever admit fails at once, naming the limit."""
    if limit.tokens_per_minute is None or tokens <= limit.tokens_per_minute:
        return None
    return StepError(
        f"model call to {model!r} needs about {tokens} tokens (its prompt and maxTokens),"
        f" more than rate limit {limit.name!r} allows in a minute"
        f" (tokensPerMinute {limit.tokens_per_minute}); the call was not made",
        error_class="llm",
        retryable=False,
    )


def admit(limit: ModelLimit, now_ms: int, tokens: int) -> tuple[Slot, ...] | int:
    """The limit's new window with the call's reservation in it, or how many ms to wait
    until the window can hold it (``tokens`` is at most the limit: see ``too_large``)."""
    current = slot_of(now_ms)
    slots = live(limit.window, current)
    if _fits(limit, slots, tokens):
        return change(slots, current, tokens, 1)
    for later in range(current + 1, current + SLOTS + 1):
        if _fits(limit, live(slots, later), tokens):
            return max(1, later * SLOT_MS - now_ms)
    raise AssertionError("an empty window admits any call within the limit")


def change(window: Sequence[Slot], index: int, tokens: int, requests: int) -> tuple[Slot, ...]:
    """``window`` with ``tokens`` and ``requests`` added to slot ``index`` (made if absent)."""
    out, found = [], False
    for s in window:
        if s.index == index:
            s = Slot(index, max(0, s.tokens + tokens), max(0, s.requests + requests))
            found = True
        out.append(s)
    if not found:
        out.append(Slot(index, max(0, tokens), max(0, requests)))
    return tuple(sorted(out, key=lambda s: s.index))


def qualified(model: str) -> str:
    """The name a limit's ``match.model`` is matched against: the provider, a slash, the
    model (``gpt-4o`` is ``openai/gpt-4o``; ``claude-...`` is ``anthropic/claude-...``)."""
    if model.startswith(("openai/", "anthropic/", offline.PREFIX)):
        return model
    provider = "anthropic" if model.startswith("claude") else "openai"
    return f"{provider}/{model}"


def matches(limit: ModelLimit, model: str) -> bool:
    return fnmatchcase(qualified(model), limit.model)


class _Definitions:
    """The limits of each (store, scopes), read at most once a ``DEFINITIONS_TTL_S``. A window
    read with them may be as old: a call it seems to fit is still written conditionally on the
    version, and a call it seems to refuse looks again before it waits."""

    def __init__(self) -> None:
        self._seen: dict[tuple[int, tuple[str, ...]], tuple[float, object, list[ModelLimit]]] = {}

    async def get(self, store: ModelLimitStore, scopes: tuple[str, ...]) -> list[ModelLimit]:
        now = time.monotonic()
        hit = self._seen.get((id(store), scopes))
        if hit is not None and hit[1] is store and now - hit[0] < DEFINITIONS_TTL_S:
            return hit[2]
        found = await store.list_limits(scopes)
        if len(self._seen) > 10_000:  # many workspaces: start over rather than grow
            self._seen.clear()
        self._seen[(id(store), scopes)] = (now, store, found)
        return found

    def forget(self) -> None:
        self._seen.clear()


definitions = _Definitions()


@dataclass(frozen=True)
class _Held:
    scope: str
    name: str
    slot: int
    tokens: int


@dataclass
class Reservation:
    """What one call reserved in each limit it matched; ``settle`` once it was made."""

    store: ModelLimitStore | None = None
    held: list[_Held] = field(default_factory=list)
    clock: Callable[[], float] = time.time

    async def settle(self, used_tokens: int | None) -> None:
        """Move each reservation to the slot of now, corrected to the ``used_tokens`` the
        provider reported (None: the call failed, so it used none; its request counts)."""
        if self.store is None:
            return
        now = slot_of(int(self.clock() * 1000))
        for h in self.held:
            await _move(self.store, h, now, 0 if used_tokens is None else used_tokens, 1)
        self.held = []

    async def release(self) -> None:
        """Give the whole reservation back (the call was not made)."""
        if self.store is None:
            return
        for h in self.held:
            await _move(self.store, h, h.slot, 0, 0)
        self.held = []


async def _move(store: ModelLimitStore, held: _Held, to: int, tokens: int, requests: int) -> None:
    """Take the reservation out of its slot (unless that has left the window) and count
    ``tokens`` and ``requests`` in slot ``to`` instead."""
    if held.slot < 0:
        return
    for _ in range(SWAPS):
        limit = await store.get_limit(held.scope, held.name)
        if limit is None:
            return
        window = limit.window
        if any(s.index == held.slot for s in window):
            window = change(window, held.slot, -held.tokens, -1)
        window = live(change(window, to, tokens, requests), to)
        if await store.swap_window(limit, window):
            return


@dataclass(frozen=True)
class Limiter:
    """The rate limits a workspace's model calls are held to: its own and the server's."""

    store: ModelLimitStore
    workspace: str
    clock: Callable[[], float] = time.time

    async def reserve(self, model: str, tokens: int) -> Reservation:
        """Reserve ``tokens`` and a request in every limit matching ``model``, or raise
        ``Throttled`` (nothing kept reserved) or a StepError for a call too large to fit."""
        found = [
            limit
            for limit in await definitions.get(self.store, (self.workspace, SERVER))
            if matches(limit, model)
        ]
        for limit in found:
            problem = too_large(limit, model, tokens)
            if problem is not None:
                raise problem
        held = Reservation(self.store, clock=self.clock)
        for limit in found:
            try:
                held.held.append(await self._one(limit, tokens))
            except Throttled:
                await held.release()
                raise
        return held

    async def _one(self, limit: ModelLimit, tokens: int) -> _Held:
        current: ModelLimit | None = limit
        fresh = False  # ``limit`` may be up to DEFINITIONS_TTL_S old
        for _ in range(SWAPS):
            if current is None:  # deleted meanwhile: nothing to hold
                return _Held(limit.scope, limit.name, -1, 0)
            now_ms = int(self.clock() * 1000)
            decided = admit(current, now_ms, tokens)
            if isinstance(decided, int) and not fresh:
                current, fresh = await self.store.get_limit(limit.scope, limit.name), True
                continue
            if isinstance(decided, int):
                # Spread the waiters a little, so they do not all ask again at one instant.
                jitter = int(random.random() * min(1000, decided // 10 + 50))
                raise Throttled(current.name, decided + jitter)
            if await self.store.swap_window(current, decided):
                return _Held(current.scope, current.name, slot_of(now_ms), tokens)
            current, fresh = await self.store.get_limit(limit.scope, limit.name), True
        raise Throttled(limit.name, BUSY_WAIT_MS)
