"""Rate limits on model calls as stored (docs/rate-limits.md), and the store role that keeps them.

A limit is its definition (which models it matches, tokens and requests per minute) plus the
window of what matching calls reserved, as slots of a few seconds each. The store knows
nothing of how a window admits a call (``lantern.models.throttle`` decides): it reads a limit
and writes its new window with one UPDATE conditional on the version it read
(``swap_window``), so replicas racing on one limit never both spend the same room.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

SERVER = ""  # the scope of a limit on every workspace's calls (the server's provider keys)


@dataclass(frozen=True)
class Slot:
    """What calls reserved in one slot of time (``index`` counts slots since the epoch)."""

    index: int
    tokens: int
    requests: int


@dataclass(frozen=True)
class ModelLimit:
    scope: str  # a workspace, or SERVER
    name: str
    model: str  # the glob a call's provider-qualified model name must match
    tokens_per_minute: int | None
    requests_per_minute: int | None
    created_at: datetime
    updated_at: datetime
    window: tuple[Slot, ...] = field(default=())
    version: int = 0


class ModelLimitStore(Protocol):
    async def put_limit(
        self,
        scope: str,
        name: str,
        model: str,
        tokens_per_minute: int | None,
        requests_per_minute: int | None,
    ) -> ModelLimit:
        """Create or replace the definition; a replaced one keeps its window (what was
        reserved this minute stays reserved)."""

    async def get_limit(self, scope: str, name: str) -> ModelLimit | None: ...

    async def list_limits(self, scopes: Sequence[str]) -> list[ModelLimit]:
        """The limits of these scopes, by scope then name."""

    async def delete_limit(self, scope: str, name: str) -> bool: ...

    async def swap_window(self, limit: ModelLimit, window: Sequence[Slot]) -> bool:
        """Write ``window`` only if the limit's version is still that of ``limit`` (as read);
        False when another replica moved it first (or it was deleted)."""


def window_to_json(window: Sequence[Slot]) -> list[list[int]]:
    return [[s.index, s.tokens, s.requests] for s in window]


def window_from_json(items: Any) -> tuple[Slot, ...]:
    return tuple(Slot(int(i), int(t), int(r)) for i, t, r in items or ())


def limit_json(limit: ModelLimit) -> dict[str, Any]:
    """A limit as the API gives it (docs/rate-limits.md)."""
    return {
        "name": limit.name,
        "scope": "server" if limit.scope == SERVER else "workspace",
        "match": {"model": limit.model},
        "tokensPerMinute": limit.tokens_per_minute,
        "requestsPerMinute": limit.requests_per_minute,
        "createdAt": limit.created_at.isoformat(),
        "updatedAt": limit.updated_at.isoformat(),
    }
