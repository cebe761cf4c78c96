"""The lease keeper's loops live as long as the worker, and a cancel interrupts the step in
flight (an async one at once; a sync tool in a thread at its return), on both backends.

The keeper's two loops used to end on their own clocks once nothing was held: the cancel
watch within half a second, the renewal after up to TTL/3. A run held next found the other
loop still alive, so the dead one was never started again. Both orders are tested. A renewal
answered after the drive's own releasing commit landed is no take-over; a real one is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
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


# A renewal in flight while a drive's own commit gives its lease up (a park, the run's end).


async def test_a_renewal_answered_after_a_releasing_commit_is_no_take_over(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The renewal pass reads the held leases; the run's commit gives its lease up; the
    renewal then reaches the database, finds the lease given up and answers before the drive
    is back from its commit (under load, with group commit, it often is first). That is the
    drive's own release, not a take-over: nothing says one happened, at the park nor at the
    run's end, and the parked run, woken on the same replica, runs to its end."""
    app = lantern.App()

    async def noop() -> str:
        return "ok"

    @app.agent("nap")
    async def nap(ctx: lantern.Context) -> str:
        await ctx.step("before", noop)
        await ctx.sleep("nap", seconds=0.2)
        result: str = await ctx.step("after", noop)
        return result

    run = await create_run(store, "nap", None, app=app)
    ttl = 1.5  # a renewal pass every 0.5 s
    landed, answered = asyncio.Event(), asyncio.Event()
    append, renew = store.append, store.renew_leases
    raced: list[str] = []

    async def append_then_wait(batch: Any) -> None:
        await append(batch)
        if batch.update is not None and batch.update.releases:
            landed.set()  # in the database; the drive is not back from its commit yet
            await asyncio.wait_for(answered.wait(), ttl * 2)
            raced.append(batch.update.status)
            landed.clear()
            answered.clear()

    async def renew_after_the_release(leases: Any, ttl: float) -> set[str]:
        late = landed.is_set() and any(lease.run_id == run.id for lease in leases)
        renewed = await renew(leases, ttl)
        if late:
            answered.set()  # the keeper reads this answer before the drive goes on
        return renewed

    monkeypatch.setattr(store, "append", append_then_wait)
    monkeypatch.setattr(store, "renew_leases", renew_after_the_release)
    caplog.set_level("WARNING", logger="lantern")
    async with Worker(store, app, worker_id="w1", lease_ttl=ttl) as w:
        assert w.runner is not None
        parked = await w.runner.drive(run.id)
        assert parked is not None and parked.status == "waiting"
        assert not w.keeper.lost(run.id)
        await asyncio.sleep(0.25)  # the nap is due
        leases = await store.claim_runs("w1", ttl, 10, ("queued",))
        assert [lease.run_id for lease in leases] == [run.id]
        done = await w.runner.drive(run.id, leases[0])
        assert done is not None and done.status == "succeeded", done
        assert not w.keeper.lost(run.id)
    assert raced == ["waiting", "succeeded"], "the renewal never raced the commit"
    said = [r.getMessage() for r in caplog.records if "taken over" in r.getMessage()]
    assert said == [], said


async def test_a_lease_taken_over_is_still_reported(
    keeper_store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A renewal that finds another holder's epoch says so, and the drive may start nothing
    more under the lease it had."""
    store = keeper_store
    lease = await leased(store, ttl=0.2)
    await asyncio.sleep(0.3)  # expired: a sweep elsewhere takes it
    thief = await store.acquire_lease(lease.run_id, "w2", 60, reclaim=False)
    assert thief is not None and thief.epoch == lease.epoch + 1
    renew, answered = store.renew_leases, asyncio.Event()

    async def renew_then_say(leases: Any, ttl: float) -> set[str]:
        renewed = await renew(leases, ttl)
        answered.set()  # the keeper reads this answer before the test goes on
        return renewed

    monkeypatch.setattr(store, "renew_leases", renew_then_say)
    caplog.set_level("WARNING", logger="lantern")
    keeper = LeaseKeeper(store, ttl=0.6)  # a renewal pass every 0.2 s
    try:
        keeper.hold(lease, lambda: None)
        await asyncio.wait_for(answered.wait(), 3)
        await asyncio.sleep(0)
        assert keeper.lost(lease.run_id)
        assert not keeper.live(lease.run_id)
    finally:
        await keeper.close()
    said = [r.getMessage() for r in caplog.records if "taken over" in r.getMessage()]
    assert said == [f"run {lease.run_id}: lease epoch {lease.epoch} was taken over"]


async def test_a_clean_stop_hands_the_run_on_at_once_despite_a_renewal_in_flight(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica stopping cleanly gives up the lease of a run it has not finished, so any
    replica may take the run at once. A renewal of that lease in flight, reaching the
    database after the release, used to take the lease again for a whole TTL, with nobody
    executing the run."""
    app = lantern.App()
    stepping, go_on = asyncio.Event(), asyncio.Event()

    async def slow() -> str:
        stepping.set()
        await go_on.wait()
        return "slow"

    async def after() -> str:
        return "after"

    @app.agent("stopped")
    async def stopped(ctx: lantern.Context) -> list[str]:
        return [await ctx.step("slow", slow), await ctx.step("after", after)]

    run = await create_run(store, "stopped", None, app=app)
    ttl = 1.5  # a renewal pass every 0.5 s
    armed, in_flight, released = asyncio.Event(), asyncio.Event(), asyncio.Event()
    answered = asyncio.Event()
    renew, release = store.renew_leases, store.release_lease

    async def renew_after_the_release(leases: Any, ttl: float) -> set[str]:
        if armed.is_set() and any(lease.run_id == run.id for lease in leases):
            armed.clear()
            in_flight.set()
            # Held until the release has gone through, or for 1 s if the release waits for it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(released.wait(), 1)
            renewed = await renew(leases, ttl)
            answered.set()
            return renewed
        return await renew(leases, ttl)

    async def noted_release(lease: Lease) -> None:
        await release(lease)
        released.set()

    monkeypatch.setattr(store, "renew_leases", renew_after_the_release)
    monkeypatch.setattr(store, "release_lease", noted_release)
    async with Worker(store, app, worker_id="w1", lease_ttl=ttl) as w:
        assert w.runner is not None
        driving = asyncio.ensure_future(w.runner.drive(run.id))
        await asyncio.wait_for(stepping.wait(), 10)
        armed.set()
        await asyncio.wait_for(in_flight.wait(), 10)  # a renewal pass holds the lease now
        w.stopping.set()  # a clean stop: the step in flight ends, the next one never starts
        go_on.set()
        stopped_run = await asyncio.wait_for(driving, 10)
        assert stopped_run is not None and stopped_run.status == "running"
        assert released.is_set()
        await asyncio.wait_for(answered.wait(), 10)
        taken = await store.acquire_lease(run.id, "w2", 60, reclaim=False)
    assert taken is not None, "the run stayed held by a replica that had let it go"
