"""What ``POST /v1/runs?wait=`` reads of the run it made: once, when the run has ended, its
children with it (``Store.run_detail``).

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
        reads: list[tuple[str, str]] = []

        def counted(name: str) -> None:
            read: Callable[[str], Awaitable[Any]] = getattr(store, name)

            async def counting(run_id: str) -> Any:
                if requesting.get():  # the request's own reads, not the receipts' batch
                    reads.append((name, run_id))
                return await read(run_id)

            setattr(store, name, counting)

        for name in ("get_run", "run_detail", "children", "run_key"):
            counted(name)

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
            # The finished run, read once, its children with it.
            assert reads == [("run_detail", body["id"])], reads

        # A read of the finished run through the API is one query too.
        reads.clear()
        token = requesting.set(True)
        try:
            got = await client.get(f"/v1/runs/{body['id']}", params={"wait": 5})
        finally:
            requesting.reset(token)
        assert got.status_code == 200, got.text
        assert (got.json()["children"], got.json()["schedule"]) == ([], None)
        assert reads == [("run_detail", body["id"])], reads
