"""The recovery sweep across replicas on PostgreSQL, with real processes.

Every replica runs with a 2 s lease TTL and a 500 ms sweep interval.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from lantern.demo.receiver import Receiver
from lantern.engine.runs import apply_agent, create_run
from lantern.store import Store
from tests.crash.processes import Serve
from tests.crash.test_sigkill import completions, wait_for, wait_for_status
from tests.helpers import http_chain

pytestmark = pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
TTL, INTERVAL = 2.0, 0.5
FAST = {"LANTERN_LEASE_TTL": "2s", "LANTERN_RECOVERY_INTERVAL": "500ms"}


def replica(store: Store, tmp_path: Path, name: str, **env: str) -> Serve:
    return Serve(store.url, tmp_path / f"{name}.log", **{**FAST, "LANTERN_WORKER_ID": name, **env})


async def test_a_standby_replica_recovers_a_killed_replicas_run(
    store: Store, receiver: Receiver, tmp_path: Path
) -> None:
    await apply_agent(store, http_chain("chain", receiver.url, 4))
    receiver.hold("/s2")
    first = replica(store, tmp_path, "r1")
    run = await create_run(store, "chain", {})
    await asyncio.to_thread(receiver.arrived.wait, 30)
    standby = replica(store, tmp_path, "r2")
    try:
        # The standby is up and sweeping (on a loaded machine its start alone can take
        # longer than the bound below); the lease is still live.
        await asyncio.to_thread(standby.wait_ready)
        killed_at = time.monotonic()
        first.kill()
        receiver.release()
        await wait_for_status(store, run.id, "succeeded", timeout=20)
        took = time.monotonic() - killed_at
    finally:
        standby.stop()
    # Lease expiry + one sweep interval + the steps themselves (and scheduling on a busy
    # 2-core machine running other tests beside this one).
    assert took <= TTL + INTERVAL + 2.5, took
    events = await store.events(run.id)
    assert completions(events) == {"start": 1, "s1": 1, "s2": 1, "s3": 1, "s4": 1}
    recovered = [e.data for e in events if e.kind == "run_recovered"]
    assert len(recovered) == 1
    assert (recovered[0]["fromWorker"], recovered[0]["toWorker"]) == ("r1", "r2")
    assert recovered[0]["attempt"] == 1 and recovered[0]["inFlight"] == ["s2"]
    assert [receiver.count(f"/s{k}") for k in (1, 3, 4)] == [1, 1, 1]
    assert receiver.count("/s2") <= 2 and len(receiver.keys("/s2")) == 1


async def test_five_replicas_recover_thirty_orphans_each_exactly_once(
    store: Store, receiver: Receiver, tmp_path: Path
) -> None:
    await apply_agent(store, http_chain("chain", receiver.url, 2))
    receiver.hold("/s1")
    doomed = replica(store, tmp_path, "doomed", LANTERN_MAX_CONCURRENT_RUNS="30")
    runs = [await create_run(store, "chain", {"n": i}) for i in range(30)]
    await wait_for(lambda: receiver.count("/s1") == 30, timeout=30)
    doomed.kill()
    receiver.release()
    # The recoverers' own leases are long, so a replica slowed by a loaded machine keeps what
    # it took: a second recovery would be right then, but it is not what this test counts.
    replicas = [replica(store, tmp_path, f"r{k}", LANTERN_LEASE_TTL="30s") for k in range(5)]
    try:
        for r in runs:
            await wait_for_status(store, r.id, "succeeded", timeout=60)
    finally:
        for serving in replicas:
            serving.stop()
    takers: Counter[str] = Counter()
    for r in runs:
        events = await store.events(r.id)
        recovered = [e.data for e in events if e.kind == "run_recovered"]
        assert len(recovered) == 1, recovered  # re-driven by exactly one replica
        assert recovered[0]["fromWorker"] == "doomed"
        takers[recovered[0]["toWorker"]] += 1
        assert completions(events) == {"start": 1, "s1": 1, "s2": 1}
    assert sum(takers.values()) == 30
    assert receiver.count("/s2") == 30 and len(receiver.keys("/s2")) == 30
    assert len(receiver.keys("/s1")) == 30 and receiver.count("/s1") <= 60


async def test_a_paused_replica_is_fenced_after_another_takes_over(
    store: Store, receiver: Receiver, tmp_path: Path
) -> None:
    await apply_agent(store, http_chain("chain", receiver.url, 3))
    receiver.hold("/s2")
    paused = replica(store, tmp_path, "paused")
    run = await create_run(store, "chain", {})
    await asyncio.to_thread(receiver.arrived.wait, 30)
    paused.proc.send_signal(signal.SIGSTOP)
    other = replica(store, tmp_path, "other")
    try:
        # After the TTL the other replica steals the run and re-sends step 2 (same key).
        await wait_for(lambda: receiver.count("/s2") == 2, timeout=20)
        receiver.release()
        await wait_for_status(store, run.id, "succeeded", timeout=20)
        before = await store.events(run.id)
        paused.proc.send_signal(signal.SIGCONT)
        await wait_for(
            lambda: "no longer current" in paused.output() or "was taken over" in paused.output(),
            timeout=10,
        )
        await asyncio.sleep(1.0)
        after = await store.events(run.id)
    finally:
        paused.proc.send_signal(signal.SIGCONT)
        paused.stop()
        other.stop()
    assert after == before  # the paused replica wrote nothing after it woke
    assert completions(after) == {"start": 1, "s1": 1, "s2": 1, "s3": 1}
    assert [e.data["toWorker"] for e in after if e.kind == "run_recovered"] == ["other"]
    assert receiver.count("/s3") == 1 and len(receiver.keys("/s2")) == 1
