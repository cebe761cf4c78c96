"""The per-workspace queue limit (LANTERN_MAX_QUEUED_RUNS, docs/security.md) at a run's create.

The limit bounds the runs waiting to start. A run ``POST /v1/runs?wait=`` starts at its create
(``Worker.start_new``: stored with its lease and opening in one commit) never waits, so its
create reads no count of the queue: on PostgreSQL that count was a query of every create. The
store counts the queue only when it leaves such a run queued after all (a version applied
since its drive was made, or flow control, which only a claim admits), in the same write
transaction, and a run past the limit is then not stored and refused as any other. The app
runs in this process against a real store on both backends, so the counts the creates make
can be seen where they reach the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

import lantern
from lantern.errors import Conflict, QueueFull
from lantern.store import Lease, Run, RunUpdate, Store
from lantern.store.records import RunFlow
from tests import in_process_api
from tests.conformance.helpers import DEFINITION, ev, fresh

app = lantern.App()
gate: dict[str, asyncio.Event] = {}


async def noop() -> None:
    return None


@app.agent("one-step")
async def one_step(ctx: lantern.Context, n: int) -> dict[str, int]:
    await ctx.step("s1", noop)
    return {"n": n}


async def held() -> None:
    await gate["open"].wait()


@app.agent("one-at-a-time", max_concurrent_runs=1)
async def one_at_a_time(ctx: lantern.Context, n: int) -> dict[str, int]:
    await ctx.step("s1", held)
    return {"n": n}


async def test_the_store_counts_the_queue_only_for_a_run_it_leaves_queued(store: Store) -> None:
    """``start_new_run`` with a queue limit: a run it starts is stored whatever the queue
    holds; one it declines to start is stored queued while the limit has room, and past it
    nothing is stored and the creator's refusal is raised."""
    await store.put_agent("default", "a", DEFINITION)
    await store.put_agent("default", "f", {**DEFINITION, "name": "f", "maxConcurrentRuns": 1})

    async def start(run: Run, max_queued: int, key: str | None = None) -> tuple[Run, Lease | None]:
        return await store.start_new_run(
            run,
            idempotency_key=key,
            request_digest="d",
            flow=lambda concurrency, max_runs: RunFlow("k", 1, max_runs),
            worker_id="w1",
            ttl=60,
            events=(ev(1, "run_started"),),
            update=RunUpdate("running"),
            max_queued=max_queued,
        )

    # Under flow control, with room: stored queued (one place of two taken).
    first, none = await start(fresh("f", 1), max_queued=2, key="first")
    assert none is None and first.status == "queued"
    await store.put_agent("default", "a", DEFINITION)  # version 2
    # A drive made for version 1: stored queued, pinned to 2 (the second place).
    stale, none = await start(fresh("a", 1), max_queued=2)
    assert none is None and (stale.status, stale.agent_version) == ("queued", 2)

    # The queue full: a run started at its create waits in no queue, and is stored.
    started, lease = await start(fresh("a", 2), max_queued=2)
    assert lease is not None and started.status == "running"

    # One the store would leave queued is refused, for either reason, and nothing stored.
    for refused in (fresh("a", 1), fresh("f", 1)):
        with pytest.raises(QueueFull):
            await start(refused, max_queued=2)
        assert await store.get_run(refused.id) is None
        assert await store.events(refused.id) == []
    assert await store.queued_count("default", 10) == 2

    # A retry of a create that was stored is told so (its creator then answers its run),
    # the queue full or not.
    with pytest.raises(Conflict):
        await start(fresh("f", 1), max_queued=2, key="first")
    found = await store.run_for_key("default", "first")
    assert found is not None and found[0].id == first.id

    # A limit with room again: the declined run is stored queued.
    roomy, none = await start(fresh("f", 1), max_queued=3)
    assert none is None and roomy.status == "queued"
    assert await store.queued_count("default", 10) == 3


@asynccontextmanager
async def served(
    database_url: str, data: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, Any, list[tuple[str, Any]]]]:
    """The app, started in this process: the client, its store, and the queue counts its
    requests read (each as ("queued_count", workspace))."""
    async with in_process_api.served(app, database_url, data, "quota-1") as (client, services):
        counts = in_process_api.count_calls(services.store, ("queued_count",))
        yield client, services.store, counts


async def create(
    client: httpx.AsyncClient, agent: str, n: int, wait: float, key: str | None = None
) -> httpx.Response:
    return await in_process_api.requested(
        client.post(
            "/v1/runs",
            params={"wait": wait},
            json={"agentName": agent, "input": {"n": n}},
            headers={} if key is None else {"Idempotency-Key": key},
        )
    )


async def test_a_create_that_starts_its_run_reads_no_queue_count(
    database_url: str, tmp_path: Path
) -> None:
    async with served(database_url, tmp_path) as (client, _, counts):
        # The first run of an agent is stored queued, and counted, then driven (the drive is
        # made for the agent's version once); from the second on the create starts the run.
        first = await create(client, "one-step", 0, wait=30)
        assert first.status_code == 200 and first.json()["status"] == "succeeded", first.text
        assert counts == [("queued_count", "default")]
        counts.clear()
        for n in range(1, 4):
            response = await create(client, "one-step", n, wait=30)
            body = response.json()
            assert response.status_code == 200, response.text
            assert body["status"] == "succeeded" and body["output"] == {"n": n}, body
        assert counts == []


async def test_a_full_queue_refuses_a_run_its_create_could_not_start(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under flow control the store declines to start a run at its create (only a claim
    admits it): stored queued, it is counted in that transaction, and refused at the limit."""
    monkeypatch.setenv("LANTERN_MAX_QUEUED_RUNS", "2")
    gate["open"] = asyncio.Event()
    async with served(database_url, tmp_path) as (client, store, counts):
        holder = await create(client, "one-at-a-time", 1, wait=0)
        assert holder.status_code == 202, holder.text
        holder_id = holder.json()["id"]
        for _ in range(200):  # claimed and driven: its one slot held
            run = await store.get_run(holder_id)
            if run.status == "running":
                break
            await asyncio.sleep(0.05)
        assert run.status == "running", run
        counts.clear()

        waiting = []
        for n in (2, 3):
            made = await create(client, "one-at-a-time", n, wait=0.05, key=f"k{n}")
            assert made.status_code == 202 and made.json()["status"] == "queued", made.text
            waiting.append(made.json()["id"])
        refused = await create(client, "one-at-a-time", 4, wait=0.05)
        assert refused.status_code == 422, refused.text
        assert "LANTERN_MAX_QUEUED_RUNS" in refused.json()["detail"]
        # A retry of a create that was stored is answered its run, the queue full or not.
        again = await create(client, "one-at-a-time", 3, wait=0.05, key="k3")
        assert again.status_code == 202 and again.json()["id"] == waiting[-1], again.text
        assert counts == []  # counted by the store, in the transaction that stored each

        listed = await client.get("/v1/runs", params={"agentName": "one-at-a-time"})
        assert sorted(r["input"]["n"] for r in listed.json()["items"]) == [1, 2, 3]

        gate["open"].set()
        for run_id in [holder_id, *waiting]:
            done = await client.get(f"/v1/runs/{run_id}", params={"wait": 30})
            assert done.json()["status"] == "succeeded", done.text
