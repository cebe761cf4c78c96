"""The lease keeper's loops live as long as the worker, and a cancel interrupts the step in
flight (an async one at once; a sync tool in a thread at its return), on both backends.

The keeper's two loops used to end on their own clocks once nothing was held: the cancel
watch within half a second, the renewal after up to TTL/3. A run held next found the other
loop still alive, so the dead one was never started again. Both orders are tested.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import lantern
from lantern.engine.cancel import cancel_run
from lantern.engine.leases import CANCEL_POLL, LeaseKeeper
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.store import Store
from lantern.store.records import Lease
from tests.integration.test_run_control import until
from tests.integration.test_runner import graph, tool


async def leased(store: Store, worker: str = "w1", ttl: float = 60) -> Lease:
    """A fresh run of the agent ``quick`` and a lease on it."""
    run = await create_run(store, "quick", {})
    lease = await store.acquire_lease(run.id, worker, ttl)
    assert lease is not None
    return lease


@pytest.fixture
async def keeper_store(store: Store) -> Store:
    await apply_agent(store, graph("quick", [tool("a")], [("start", "a")]))
    return store


async def test_a_cancel_is_seen_after_the_keeper_held_nothing(keeper_store: Store) -> None:
    """The cancel watch must outlive a quiet spell while the renewal loop sleeps."""
    store = keeper_store
    keeper = LeaseKeeper(store, ttl=60)  # the renewal loop sleeps 20 s: alive throughout
    try:
        first = await leased(store)
        keeper.hold(first, lambda: None)
        await asyncio.sleep(0.1)  # the first run takes a moment, then finishes
        keeper.drop(first)
        await asyncio.sleep(CANCEL_POLL * 2.5)  # the old cancel watch ended here
        second = await leased(store)
        seen = asyncio.Event()
        keeper.hold(second, seen.set)
        assert await store.request_cancel(second.run_id)
        await asyncio.wait_for(seen.wait(), CANCEL_POLL * 6)
    finally:
        await keeper.close()


async def test_a_lease_held_after_a_quiet_spell_is_renewed(keeper_store: Store) -> None:
    """The renewal loop must outlive a quiet spell while the cancel watch sleeps."""
    store = keeper_store
    ttl = 0.75  # renewal every 0.25 s, sooner than the cancel watch's 0.5 s poll
    keeper = LeaseKeeper(store, ttl=ttl)
    try:
        first = await leased(store, ttl=ttl)
        second = await leased(store, ttl=ttl)
        keeper.hold(first, lambda: None)
        await asyncio.sleep(0.1)
        keeper.drop(first)
        # At 0.25 s the old renewal loop woke to nothing held and ended; the cancel watch
        # sleeps until 0.5 s, so a run held now found a loop alive and started none.
        await asyncio.sleep(0.25)
        keeper.hold(second, lambda: None)
        await asyncio.sleep(ttl * 2.5)
        assert keeper.live(second.run_id), "the lease was not renewed"
        stolen = await store.acquire_lease(second.run_id, "thief", ttl, reclaim=False)
        assert stolen is None, "another replica could take the run while its holder lives"
    finally:
        await keeper.close()


async def test_the_loops_keep_running_while_nothing_is_held(keeper_store: Store) -> None:
    keeper = LeaseKeeper(keeper_store, ttl=0.3)
    keeper.start()
    await asyncio.sleep(0.5)
    assert [t.done() for t in keeper._tasks.values()] == [False, False]
    await keeper.close()
    assert not keeper._tasks


# Through a real worker, as a user met it: runs finish, then a running run is cancelled.

started: dict[str, threading.Event] = {}
interrupted: dict[str, bool] = {}


def cancel_app() -> lantern.App:
    a = lantern.App()

    @a.tool("echo")
    async def echo(**kwargs: Any) -> dict[str, Any]:
        return kwargs

    @a.tool("slow_async")
    async def slow_async(ctx: lantern.ToolContext) -> dict[str, Any]:
        started[ctx.run_id].set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            interrupted[ctx.run_id] = True
            raise
        return {}

    @a.tool("slow_sync")
    def slow_sync(ctx: lantern.ToolContext) -> dict[str, Any]:
        started[ctx.run_id].set()
        time.sleep(1.5)  # a thread: nothing can interrupt it
        return {"slept": 1.5}

    return a


@pytest.fixture
async def cancel_worker(store: Store) -> AsyncIterator[Worker]:
    for slow in ("slow_async", "slow_sync"):
        await apply_agent(
            store,
            graph(slow, [tool("slow", slow), tool("next")], [("start", "slow"), ("slow", "next")]),
        )
    await apply_agent(store, graph("quick", [tool("a")], [("start", "a")]))
    async with Worker(store, cancel_app(), worker_id="w1", lease_ttl=60, poll_interval=0.05) as w:
        task = asyncio.create_task(w.serve())
        yield w
        await w.stop(grace=3)
        await task


async def finish_three_runs(store: Store) -> None:
    for _ in range(3):
        run = await create_run(store, "quick", {})
        await until(store, run.id, "succeeded")
    await asyncio.sleep(CANCEL_POLL * 2.5)  # long enough for the old cancel watch to end


async def start_slow(store: Store, agent: str) -> str:
    run = await create_run(store, agent, {})
    started[run.id] = threading.Event()
    assert await asyncio.to_thread(started[run.id].wait, 30), "the slow step never started"
    return run.id


async def test_cancel_interrupts_an_async_step_after_earlier_runs(
    store: Store, cancel_worker: Worker
) -> None:
    await finish_three_runs(store)
    run_id = await start_slow(store, "slow_async")
    asked = time.monotonic()
    await cancel_run(store, run_id, "api", 60)
    done = await until(store, run_id, "cancelled", "succeeded", "failed", timeout=10)
    assert done.status == "cancelled"
    assert time.monotonic() - asked < 5, "a cancel must not wait for the 30 s step"
    assert interrupted.get(run_id), "the async tool was not cancelled"
    events = await store.events(run_id)
    assert [e.step_id for e in events if e.kind == "step_started"][-1] == "slow"
    assert "next" not in {e.step_id for e in events}
    assert events[-1].kind == "run_cancelled"
    assert "uninterruptible" not in events[-1].data


async def test_cancel_stops_a_sync_tool_at_its_return(store: Store, cancel_worker: Worker) -> None:
    await finish_three_runs(store)
    run_id = await start_slow(store, "slow_sync")
    await cancel_run(store, run_id, "api", 60)
    done = await until(store, run_id, "cancelled", "succeeded", "failed", timeout=10)
    assert done.status == "cancelled"
    events = await store.events(run_id)
    by_kind = [(e.kind, e.step_id) for e in events]
    # The thread ran to its end: its output is journaled, and the next step never started.
    assert ("step_completed", "slow") in by_kind
    assert "next" not in {e.step_id for e in events}
    assert events[-1].kind == "run_cancelled"
    assert events[-1].data["uninterruptible"] == ["slow"]
