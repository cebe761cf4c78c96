"""What ``POST /v1/runs?wait=`` reads of the run it made: once, when the run has ended.

The run a replica starts at its create (``Worker.start_new``) is as its opening commit stored
it until it ends, and its end is heard by the commit notifier (remembered for a run that ended
before the waiter subscribed): reading it before the wait bought nothing but a round trip per
run, on PostgreSQL a query of the server path that the same run driven in-process never made
(bench/service.py). The app runs in this process, against a real store on both backends, so
the route's reads of the run can be counted where they reach the store.
"""

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
from lantern.store import Run

requesting: ContextVar[bool] = ContextVar("requesting", default=False)

app = lantern.App()


async def noop() -> None:
    return None


@app.agent("one-step")
async def one_step(ctx: lantern.Context, n: int) -> dict[str, int]:
    await ctx.step("s1", noop)
    return {"n": n}


@asynccontextmanager
async def served(database_url: str, data: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    """The app of `lantern serve`, started in this process; the client and its services."""
    settings = Settings(database_url=database_url, worker_id="reads-1", data_dir=str(data))
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


async def test_a_create_that_waits_reads_its_started_run_once(
    database_url: str, tmp_path: Path
) -> None:
    async with served(database_url, tmp_path) as (client, services):
        store: Any = services.store
        get_run: Callable[[str], Awaitable[Run | None]] = store.get_run
        reads: list[str] = []

        async def counted(run_id: str) -> Run | None:
            if requesting.get():  # the request's own reads, not the receipts' in the background
                reads.append(run_id)
            return await get_run(run_id)

        store.get_run = counted

        async def create(n: int) -> dict[str, Any]:
            token = requesting.set(True)
            try:
                response = await client.post(
                    "/v1/runs",
                    params={"wait": 30},
                    json={"agentName": "one-step", "input": {"n": n}},
                )
            finally:
                requesting.reset(token)
            assert response.status_code == 200, response.text
            body: dict[str, Any] = response.json()
            assert body["status"] == "succeeded" and body["output"] == {"n": n}, body
            assert body["children"] == []
            return body

        # The first run of an agent is stored queued and then driven (the drive is made for
        # the agent's version once); from the second on, the create starts the run itself.
        await create(0)
        for n in range(1, 4):
            reads.clear()
            body = await create(n)
            assert reads == [body["id"]], reads  # the finished run, read once
