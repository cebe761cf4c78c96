"""Runs waiting on a slow peer never fail for a local reason: 500 runs on one replica, each
waiting 5 s on an HTTP connector, all succeed (httpx's default pool of 100 connections made
the queued ones time out before sending anything); and a request queued for its host's slot
does not spend its step's timeout, which starts when it is sent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import lantern
from lantern import outbound
from lantern.effects import http
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.store import Store
from tests.slow_peer import SlowPeer

RUNS = 500
DELAY = 5.0


@pytest.fixture
def slow_peer() -> Iterator[SlowPeer]:
    peer = SlowPeer(DELAY)
    yield peer
    peer.close()


@pytest.fixture
async def wide_worker(store: Store) -> AsyncIterator[Worker]:
    async with Worker(
        store, lantern.App(), worker_id="w1", lease_ttl=60, max_concurrent=RUNS, poll_interval=0.05
    ) as w:
        task = asyncio.create_task(w.serve())
        yield w
        await w.stop(grace=5)
        await task


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)  # the pool, not the store
async def test_five_hundred_runs_wait_on_a_slow_peer_and_all_succeed(
    store: Store, slow_peer: SlowPeer, wide_worker: Worker
) -> None:
    await apply_agent(
        store,
        {
            "name": "slow",
            "graph": {
                "nodes": [
                    {"id": "start", "type": "trigger"},
                    {
                        "id": "call",
                        "type": "connector",
                        "data": {
                            "connector": "http",
                            "url": f"{slow_peer.url}/hook",
                            "body": {"n": "{{ input.n }}"},
                            "timeoutMs": int(
                                DELAY * 1000 * 4
                            ),  # queued 4 rounds deep behind a pool of 100, it would fail
                        },
                    },
                ],
                "edges": [{"source": "start", "target": "call"}],
            },
        },
    )
    runs = [await create_run(store, "slow", {"n": n}) for n in range(RUNS)]
    async with asyncio.timeout(120):
        while True:
            found = [await store.get_run(r.id) for r in runs]
            if all(r is not None and r.finished for r in found):
                break
            await asyncio.sleep(0.5)
    statuses = [r.status for r in found if r is not None]
    failed = [r.error for r in found if r is not None and r.status != "succeeded"]
    assert statuses.count("succeeded") == RUNS, failed[:3]
    most = await asyncio.to_thread(lambda: slow_peer.most)
    assert most > 100, "requests were held back by a local pool"


async def test_waiting_for_a_slot_does_not_spend_the_steps_timeout(slow_peer: SlowPeer) -> None:
    """Two slots for the host, six requests of 5 s, each with a 7.5 s timeout: the last ones
    wait 10 s for a slot and still succeed, because their timeout starts when they are sent."""
    outbound.configure(2)
    try:
        async with outbound.client() as client:

            async def one(n: int) -> dict[str, Any]:
                return await http.send(
                    client,
                    method="POST",
                    url=f"{slow_peer.url}/q",
                    headers={},
                    body={"n": n},
                    idempotency_key=f"k{n}",
                    timeout_s=DELAY * 1.5,
                )

            started = time.monotonic()
            answers = await asyncio.gather(*(one(n) for n in range(6)))
            took = time.monotonic() - started
    finally:
        outbound.configure(outbound.DEFAULT_PER_HOST)
    assert [a["status"] for a in answers] == [200] * 6
    assert await asyncio.to_thread(lambda: slow_peer.most) == 2
    assert took >= 3 * DELAY * 0.9
