"""Schedules fire runs (docs/schedules.md), on both backends, against a clock the test sets:
catch-up after every replica was down, per policy; overlap policies; replicas racing on one
fire time. The schedule fires the same runs for graph, plain, code-first and microVM agents
(a fire is a run created under a key; what drives the run is the run's kind), so a graph
agent stands for all four here. tests/crash/test_schedule_replicas.py kills a real replica.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest

from lantern.engine.runs import apply_agent
from lantern.engine.schedules import ScheduleLoop, apply_schedule, fire_key, trigger
from lantern.errors import DefinitionError
from lantern.store.base import Store

AGENT = {"name": "tick", "graph": {"nodes": [{"id": "start", "type": "trigger"}], "edges": []}}
GRACE = 1.0  # the replicas' recovery interval


async def schedule(store: Store, name: str, **fields: Any) -> datetime:
    await apply_agent(store, AGENT)
    s = await apply_schedule(store, "default", name, {"agentName": "tick", **fields})
    return s.next_fire_at


async def keys(store: Store, name: str) -> list[str]:
    runs = await store.schedule_runs("default", name, limit=500)
    found = [await store.run_key(r.id) for r in runs]
    return sorted(k for k in found if k is not None)


@pytest.mark.parametrize(
    ("catchup", "fired"),
    [("none", []), ("latest", [10]), ("all", [0, 2, 4, 6, 8, 10])],
)
async def test_catchup_after_every_replica_was_down(
    store: Store, catchup: str, fired: list[int]
) -> None:
    first = await schedule(store, "s", every="2s", catchup=catchup, overlap="allow")
    loop = ScheduleLoop(store, grace=GRACE)
    # Down from before the first fire time until 11.5 s after it: six fire times passed,
    # the newest 1.5 s ago (later than the grace, so missed).
    back = first + timedelta(seconds=11.5)
    await loop.fire_due(back)
    assert await keys(store, "s") == sorted(
        fire_key("s", first + timedelta(seconds=k)) for k in fired
    )
    s = await store.get_schedule("default", "s")
    assert s is not None and s.next_fire_at == first + timedelta(seconds=12)
    assert {k.reason for k in s.recent_skips} == ({"catchup"} if catchup != "all" else set())
    # Up again: the next fire time fires on time under every policy, once.
    await loop.fire_due(first + timedelta(seconds=12.2))
    await loop.fire_due(first + timedelta(seconds=12.4))
    assert len(await keys(store, "s")) == len(fired) + 1


async def test_a_late_fire_within_the_grace_is_not_missed(store: Store) -> None:
    first = await schedule(store, "s", every="1h", catchup="none")
    await ScheduleLoop(store, grace=GRACE).fire_due(first + timedelta(seconds=0.8))
    assert await keys(store, "s") == [fire_key("s", first)]


@pytest.mark.parametrize(
    ("overlap", "runs", "buffered"),
    [("skip", 1, False), ("buffer_one", 1, True), ("allow", 3, False)],
)
async def test_overlap_while_the_previous_run_is_unfinished(
    store: Store, overlap: str, runs: int, buffered: bool
) -> None:
    first = await schedule(store, "s", every="1s", overlap=overlap, catchup="all")
    loop = ScheduleLoop(store, grace=GRACE)
    for k in range(3):  # the runs stay queued: no worker drives them
        await loop.fire_due(first + timedelta(seconds=k, milliseconds=100))
    assert len(await keys(store, "s")) == runs
    s = await store.get_schedule("default", "s")
    assert s is not None
    assert (s.buffered_fire_at is not None) == buffered
    if overlap != "allow":
        assert [k.reason for k in s.recent_skips] == ["overlap"] * (2 - buffered)


async def test_a_buffered_fire_starts_when_the_previous_run_ends(store: Store) -> None:
    first = await schedule(store, "s", every="1s", overlap="buffer_one")
    loop = ScheduleLoop(store, grace=GRACE)
    await loop.fire_due(first)
    await loop.fire_due(first + timedelta(seconds=1))
    s = await store.get_schedule("default", "s")
    assert s is not None and s.last_run_id is not None and s.buffered_fire_at is not None
    assert await store.request_cancel(s.last_run_id)
    await _finish(store, s.last_run_id)
    await loop.fire_due(first + timedelta(seconds=1.5))
    assert await keys(store, "s") == [fire_key("s", first + timedelta(seconds=k)) for k in (0, 1)]


async def _finish(store: Store, run_id: str) -> None:
    from lantern.app import App
    from lantern.engine.worker import Worker  # a real worker drives the cancel to its end

    async with Worker(store, App(), worker_id="w", lease_ttl=5.0, poll_interval=0.05) as w:
        task = asyncio.create_task(w.serve())
        for _ in range(200):
            run = await store.get_run(run_id)
            if run is not None and run.finished:
                break
            await asyncio.sleep(0.05)
        w.stopping.set()
        await task


async def test_replicas_racing_on_one_fire_time_start_one_run(store: Store) -> None:
    first = await schedule(store, "s", every="1s", overlap="allow", catchup="all")
    loops = [ScheduleLoop(store, grace=GRACE) for _ in range(4)]
    for k in range(3):
        at = first + timedelta(seconds=k, milliseconds=50)
        await asyncio.gather(*(loop.fire_due(at) for loop in loops))
    assert await keys(store, "s") == [fire_key("s", first + timedelta(seconds=k)) for k in range(3)]


async def test_paused_fires_nothing_then_resuming_catches_up(store: Store) -> None:
    first = await schedule(store, "s", every="1s", paused=True, overlap="allow", catchup="latest")
    loop = ScheduleLoop(store, grace=GRACE)
    assert await loop.fire_due(first + timedelta(seconds=5.5)) == []
    await apply_schedule(
        store, "default", "s", {"agentName": "tick", "every": "1s", "overlap": "allow"}
    )
    started = await loop.fire_due(first + timedelta(seconds=5.5))
    assert [await store.run_key(r.id) for r in started] == [
        fire_key("s", first + timedelta(seconds=5))
    ]


async def test_trigger_starts_a_run_now_whatever_the_overlap(store: Store) -> None:
    await schedule(store, "s", cron="0 6 * * *", timezone="Europe/Paris")
    a = await trigger(store, "default", "s")
    b = await trigger(store, "default", "s")
    assert a.id != b.id
    s = await store.get_schedule("default", "s")
    assert s is not None and s.last_run_id == b.id


@pytest.mark.parametrize(
    "body",
    [
        {"agentName": "tick", "cron": "61 * * * *"},
        {"agentName": "tick", "cron": "0 6 * * *", "timezone": "Mars/Olympus"},
        {"agentName": "tick", "cron": "0 6 * * *", "timezone": "../../etc/passwd"},
        {"agentName": "tick", "every": "500ms"},
        {"agentName": "tick", "every": "1s", "cron": "* * * * *"},
        {"agentName": "tick"},
        {"agentName": "tick", "every": "1s", "overlap": "sometimes"},
        {"agentName": "tick", "cron": "0 0 30 2 *"},
    ],
)
async def test_a_bad_definition_is_refused_and_changes_nothing(
    store: Store, body: dict[str, Any]
) -> None:
    with pytest.raises(DefinitionError):
        await apply_schedule(store, "default", "s", body)
    assert await store.list_schedules("default") == []
