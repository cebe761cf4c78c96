"""A run parked at an approval after a step whose output is kept as a blob (over 16 KiB) can be
approved and cancelled: in the engine, through the API and through the SDK, on both backends."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import lantern
from lantern.engine.approvals import decide
from lantern.engine.cancel import cancel_run
from lantern.engine.journal import INLINE_LIMIT, OutputRef, fold
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.sdk import AsyncClient, Client
from lantern.store import Store
from tests.integration.test_run_control import until
from tests.server import ALL_SCOPES, Server, make_key

BIG = "x" * (40 * 1024)  # a long model answer, an HTTP body: kept as a blob

ECHO_INPUT = {"tool": "noop", "args": {"text": "{{ input }}"}}
PARKED = {
    "name": "parked",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {
                "id": "big",
                "type": "tool",
                "data": {"tool": "noop", "args": {"text": "{{ input }}"}},
            },
            {"id": "ok", "type": "approval", "data": {"prompt": "Send it?"}},
            {
                "id": "after",
                "type": "tool",
                "data": {"tool": "noop", "args": {"size": "{{ steps.big.output.text | length }}"}},
            },
        ],
        "edges": [
            {"source": "start", "target": "big"},
            {"source": "big", "target": "ok"},
            {"source": "ok", "target": "after"},
        ],
    },
}


def app() -> lantern.App:
    a = lantern.App()

    @a.tool("noop")
    async def noop(**kwargs: Any) -> dict[str, Any]:
        return kwargs

    return a


@pytest.fixture
async def worker(store: Store) -> AsyncIterator[Worker]:
    async with Worker(store, app(), worker_id="w1", lease_ttl=60, poll_interval=0.05) as w:
        task = asyncio.create_task(w.serve())
        yield w
        await w.stop(grace=1)
        await task


async def test_fold_without_blobs_gives_a_reference(store: Store, worker: Worker) -> None:
    await apply_agent(store, PARKED)
    run = await create_run(store, "parked", BIG)
    await until(store, run.id, "waiting")
    state = fold(await store.events(run.id))  # no blobs read
    ref = state.outputs["big"]
    assert isinstance(ref, OutputRef) and ref.size > INLINE_LIMIT
    assert ref.digest.startswith("sha256:")
    assert fold(await store.events(run.id, blobs=True)).outputs["big"] == {"text": BIG}


async def test_approve_after_a_large_output(store: Store, worker: Worker) -> None:
    await apply_agent(store, PARKED)
    run = await create_run(store, "parked", BIG)
    parked = await until(store, run.id, "waiting")
    made = await decide(store, parked, "ok", "approved", "key:ada")
    assert made.decision == "approved"
    done = await until(store, run.id, "succeeded", "failed")
    assert done.status == "succeeded", done.error
    assert done.output == {"size": len(BIG)}


async def test_cancel_after_a_large_output_releases_the_lease(store: Store, worker: Worker) -> None:
    await apply_agent(store, PARKED)
    run = await create_run(store, "parked", BIG)
    await until(store, run.id, "waiting")
    cancelled = await cancel_run(store, run.id, "canceller", 30)
    assert cancelled.status == "cancelled"
    assert [e.kind for e in await store.events(run.id)][-1] == "run_cancelled"
    # Nobody holds the run: another worker could take its lease at once.
    assert all(run.id not in w.runs for w in await store.list_workers())
    lease = await store.acquire_lease(run.id, "someone-else", 30, reclaim=False)
    assert lease is not None
    await store.release_lease(lease)


async def _until_waiting(client: AsyncClient, run_id: str) -> None:
    async with asyncio.timeout(30):
        while True:
            if (await client.get_run(run_id)).status == "waiting":
                return
            await asyncio.sleep(0.05)


@pytest.fixture
def api_server(module_server: Server) -> Server:
    """The module's server (both backends): each test's key is in a workspace of its own."""
    return module_server


@pytest.fixture
def key(api_server: Server) -> str:
    return make_key(api_server.database_url, f"big-{secrets.token_hex(4)}", ALL_SCOPES)


async def test_approve_and_cancel_through_the_api_and_the_sdk(api_server: Server, key: str) -> None:
    async with AsyncClient(api_server.url, key) as client:
        await client.apply_agent(PARKED)
        approved = await client.create_run("parked", BIG)
        cancelled = await client.create_run("parked", BIG)
        await _until_waiting(client, approved.id)
        await _until_waiting(client, cancelled.id)

        decision = await client.approve(approved.id, "ok", comment="fine")
        assert decision["decision"] == "approved" and decision["comment"] == "fine"
        assert decision["runId"] == approved.id and decision["nodeId"] == "ok"
        done = await client.wait(approved.id, timeout=30)
        assert done.status == "succeeded" and done.output == {"size": len(BIG)}

        stopped = await client.cancel(cancelled.id)
        assert stopped.status == "cancelled"
        assert (await client.events(cancelled.id))[-1].kind == "run_cancelled"


def test_the_sync_client_approves_after_a_large_output(api_server: Server, key: str) -> None:
    with Client(api_server.url, key) as client:
        client.apply_agent(PARKED)
        run = client.create_run("parked", BIG)
        for _ in range(600):
            if client.get_run(run.id).status == "waiting":
                break
            time.sleep(0.05)
        decision = client.approve(run.id, "ok", "reject")
        assert decision["decision"] == "rejected"
        assert client.wait(run.id, timeout=30).status == "failed"
