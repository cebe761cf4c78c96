"""One SDK client per provider per process (per event loop: an HTTP pool belongs to its loop).

The SDKs read their own environment (``OPENAI_API_KEY``/``OPENAI_BASE_URL``,
``ANTHROPIC_API_KEY``/``ANTHROPIC_BASE_URL``). Their hidden retries are off: Lantern's retry
policy owns retries, journals each attempt and gives each its own idempotency key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar


class Closable(Protocol):
    async def close(self) -> Any: ...


C = TypeVar("C", bound=Closable)


class PerLoop(Generic[C]):
    """A lazily made client, remade when called from another event loop."""

    def __init__(self, make: Callable[[], C]) -> None:
        self._make = make
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: C | None = None

    def get(self) -> C:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = self._make()
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the client made on the running loop (a process exiting need not bother)."""
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.close()
