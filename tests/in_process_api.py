"""The app of `lantern serve` started in the test's process, and a count of the store calls its
requests make: for tests of what a request reads, counted where it reaches a real store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

import lantern
from lantern.config import Settings
from lantern.server.app import create_app
from lantern.server.auth import issue_key
from lantern.server.deps import Services

# Set while a test's request is under way: the calls it makes, not the background's (the
# receipts' batch, the dispatcher's claims).
requesting: ContextVar[bool] = ContextVar("requesting", default=False)


@asynccontextmanager
async def served(
    app: lantern.App, database_url: str, data: Path, worker_id: str
) -> AsyncIterator[tuple[httpx.AsyncClient, Services]]:
    """The app, started in this process; a client with a key for runs, and its services."""
    settings = Settings(database_url=database_url, worker_id=worker_id, data_dir=str(data))
    guard: Any = create_app(settings, app, grace=5)
    api: FastAPI = guard.app
    async with api.router.lifespan_context(api):
        services: Services = api.state.services
        _, key = await issue_key(services.store, "default", {"runs:execute", "runs:read"})
        transport = httpx.ASGITransport(app=guard)
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://lantern", headers=headers, timeout=30
        ) as client:
            yield client, services


def count_calls(store: Any, names: tuple[str, ...]) -> list[tuple[str, Any]]:
    """Record each call of the store's methods ``names`` made while ``requesting``, as (name,
    first argument), and pass it on to the real method."""
    calls: list[tuple[str, Any]] = []
    for name in names:
        real: Callable[..., Awaitable[Any]] = getattr(store, name)

        def counting(real: Callable[..., Awaitable[Any]], name: str) -> Callable[..., Any]:
            async def call(first: Any, *args: Any) -> Any:
                if requesting.get():
                    calls.append((name, first))
                return await real(first, *args)

            return call

        setattr(store, name, counting(real, name))
    return calls


async def requested(call: Awaitable[httpx.Response]) -> httpx.Response:
    """``call``'s answer, its store calls counted as the request's."""
    token = requesting.set(True)
    try:
        return await call
    finally:
        requesting.reset(token)
