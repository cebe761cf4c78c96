"""SIGKILL a real executor mid-run, restart it with the same worker id, and count deliveries."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lantern.demo.receiver import Receiver
from lantern.engine.runs import apply_agent, create_run
from lantern.store import Event, Store
from tests.crash.processes import Serve
from tests.helpers import http_chain

STEPS = [f"s{k}" for k in range(1, 6)]


async def wait_for_status(store: Store, run_id: str, status: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = await store.get_run(run_id)
        assert run is not None
        if run.status == status:
            return
        assert not run.finished, f"run {run_id} ended {run.status}: {run.error}"
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} did not reach {status} within {timeout}s")


async def wait_for(check: Callable[[], object], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)


def completions(events: list[Event]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in events:
        if e.kind == "step_completed" and e.step_id:
            counts[e.step_id] = counts.get(e.step_id, 0) + 1
    return counts


async def test_sigkill_while_step_3_is_in_flight(
    store: Store, receiver: Receiver, tmp_path: Path
) -> None:
    await apply_agent(store, http_chain("chain", receiver.url, 5))
    run = await create_run(store, "chain", {"order": 42})
    receiver.hold("/s3")
    first = Serve(store.url, tmp_path / "serve.log", LANTERN_WORKER_ID="w1")
    await asyncio.to_thread(receiver.arrived.wait, 30)
    assert receiver.count("/s3") == 1
    first.kill()  # step 3's request is in flight, unanswered
    receiver.release()

    began = time.monotonic()
    second = Serve(store.url, tmp_path / "serve.log", LANTERN_WORKER_ID="w1")
    try:
        await wait_for_status(store, run.id, "succeeded")
    finally:
        second.stop()
    # The same worker id takes its run back at once, not after the 10-minute lease TTL.
    assert time.monotonic() - began < 20

    assert [receiver.count(f"/{s}") for s in ("s1", "s2", "s4", "s5")] == [1, 1, 1, 1]
    assert 1 <= receiver.count("/s3") <= 2
    assert len(receiver.keys("/s3")) == 1
    events = await store.events(run.id)
    assert completions(events) == {s: 1 for s in ["start", *STEPS]}
    recovered = [e for e in events if e.kind == "run_recovered"]
    assert len(recovered) == 1
    assert recovered[0].data["inFlight"] == ["s3"]
    assert recovered[0].data["replayed"] == ["s1", "s2", "start"]


async def test_crash_between_step_2_completed_and_step_3(
    store: Store, receiver: Receiver, tmp_path: Path
) -> None:
    await apply_agent(store, http_chain("chain", receiver.url, 5))
    run = await create_run(store, "chain", {"order": 7})
    crashing = Serve(
        store.url,
        tmp_path / "serve.log",
        LANTERN_WORKER_ID="w1",
        LANTERN_TEST_CRASH_AFTER="step_completed:s2",
    )
    code = await asyncio.to_thread(crashing.proc.wait, 30)
    crashing.out.close()
    assert code == -9, crashing.output()
    events = await store.events(run.id)
    assert completions(events) == {"start": 1, "s1": 1, "s2": 1}
    assert receiver.count("/s3") == 0

    second = Serve(store.url, tmp_path / "serve.log", LANTERN_WORKER_ID="w1")
    try:
        await wait_for_status(store, run.id, "succeeded")
    finally:
        second.stop()
    assert [receiver.count(f"/{s}") for s in STEPS] == [1, 1, 1, 1, 1]
    assert completions(await store.events(run.id)) == {s: 1 for s in ["start", *STEPS]}


async def test_a_clean_stop_releases_leases_and_a_new_worker_finishes(
    store: Store, receiver: Receiver, tmp_path: Path
) -> None:
    await apply_agent(store, http_chain("chain", receiver.url, 3))
    run = await create_run(store, "chain", {})
    receiver.hold("/s2")
    first = Serve(store.url, tmp_path / "serve.log", LANTERN_WORKER_ID="w1")
    await asyncio.to_thread(receiver.arrived.wait, 30)
    stopping = asyncio.create_task(asyncio.to_thread(first.stop))
    await asyncio.sleep(0.3)
    receiver.release()  # the step in flight finishes within the grace period
    assert await stopping == 0
    events = await store.events(run.id)
    assert completions(events)["s2"] == 1
    assert receiver.count("/s3") == 0  # no new step after the stop began
    lease_holder = await store.claim_runs("w2", 60, 10, ("running",))
    assert [lease.run_id for lease in lease_holder] == [run.id]  # the lease was released


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_two_replicas_share_queued_runs_and_run_each_step_once(
    store: Store, receiver: Receiver, tmp_path: Path
) -> None:
    await apply_agent(store, http_chain("chain", receiver.url, 3))
    replicas = [
        Serve(
            store.url,
            tmp_path / f"serve-{w}.log",
            LANTERN_WORKER_ID=w,
            LANTERN_MAX_CONCURRENT_RUNS="3",
        )
        for w in ("a", "b")
    ]
    try:
        # Both replicas are up (they heartbeat) before there is work to race for.
        for _ in range(600):
            if {w.id for w in await store.list_workers()} >= {"a", "b"}:
                break
            await asyncio.sleep(0.05)
        runs = [await create_run(store, "chain", {"n": i}) for i in range(20)]
        for r in runs:
            await wait_for_status(store, r.id, "succeeded", timeout=60)
    finally:
        for replica in replicas:
            replica.stop()
    for s in ("s1", "s2", "s3"):
        assert receiver.count(f"/{s}") == 20
        assert len(receiver.keys(f"/{s}")) == 20
    workers = set()
    for r in runs:
        events = await store.events(r.id)
        assert completions(events) == {"start": 1, "s1": 1, "s2": 1, "s3": 1}
        assert not [e for e in events if e.kind == "run_recovered"]
        workers.add(events[0].data["worker"])
    assert workers == {"a", "b"}, "both replicas should have taken part"


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_a_stale_executor_is_fenced_when_another_takes_its_run(
    store: Store, receiver: Receiver, tmp_path: Path
) -> None:
    await apply_agent(store, http_chain("chain", receiver.url, 4))
    run = await create_run(store, "chain", {})
    receiver.hold("/s2")
    stale = Serve(store.url, tmp_path / "stale.log", LANTERN_WORKER_ID="w1")
    await asyncio.to_thread(receiver.arrived.wait, 30)
    # A second process with the same worker id takes the run back (a new epoch) and re-sends
    # step 2 with the same key; both requests are now in flight.
    fresh = Serve(store.url, tmp_path / "fresh.log", LANTERN_WORKER_ID="w1")
    await wait_for(lambda: receiver.count("/s2") == 2)
    receiver.release()
    try:
        await wait_for_status(store, run.id, "succeeded")
        await wait_for(lambda: "no longer current" in stale.output(), timeout=10)
    finally:
        stale.stop()
        fresh.stop()
    assert len(receiver.keys("/s2")) == 1
    assert [receiver.count(f"/{s}") for s in ("s1", "s3", "s4")] == [1, 1, 1]
    events = await store.events(run.id)
    assert completions(events) == {"start": 1, "s1": 1, "s2": 1, "s3": 1, "s4": 1}
    recovered = [e for e in events if e.kind == "run_recovered"]
    assert [e.data["epoch"] for e in recovered] == [2]
