"""Every store behaviour, run against SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from lantern.engine.journal import EventWriter, fold
from lantern.engine.runs import create_run
from lantern.errors import Conflict, LeaseLost, StoreError
from lantern.store import Append, NewEvent, Run, RunUpdate, Store

DEFINITION = {"name": "a", "graph": {"nodes": [{"id": "start", "type": "trigger"}], "edges": []}}


async def new_run(store: Store, name: str = "a") -> Run:
    if await store.get_agent("default", name) is None:
        await store.put_agent("default", name, {**DEFINITION, "name": name})
    return await create_run(store, name, {"n": 1})


def ev(seq: int, kind: str, step: str | None = None, **data: object) -> NewEvent:
    return NewEvent(
        seq=seq,
        kind=kind,
        at=datetime.now(UTC),
        data=dict(data),
        step_id=step,
        node_id=step,
        attempt=1 if step else None,
    )


async def test_agent_versions_are_immutable_and_numbered(store: Store) -> None:
    v1 = await store.put_agent("default", "a", {**DEFINITION, "v": 1})
    v2 = await store.put_agent("default", "a", {**DEFINITION, "v": 2})
    assert (v1.version, v2.version) == (1, 2)
    assert (await store.get_agent("default", "a", 1)).definition["v"] == 1  # type: ignore[union-attr]
    assert (await store.get_agent("default", "a")).definition["v"] == 2  # type: ignore[union-attr]
    assert await store.get_agent("default", "a", 3) is None
    assert await store.get_agent("other", "a") is None
    listed = await store.list_agents("default")
    assert [(a.name, a.version) for a in listed] == [("a", 2)]


async def test_a_run_is_pinned_to_the_version_it_started_with(store: Store) -> None:
    run = await new_run(store)
    await store.put_agent("default", "a", {**DEFINITION, "v": 2})
    loaded = await store.get_run(run.id)
    assert loaded is not None and loaded.agent_version == 1
    assert (loaded.status, loaded.input) == ("queued", {"n": 1})


async def test_list_runs_filters_and_pages_newest_first(store: Store) -> None:
    ids = [(await new_run(store)).id for _ in range(5)]
    await new_run(store, "b")
    page1 = await store.list_runs("default", agent_name="a", limit=3)
    page2 = await store.list_runs("default", agent_name="a", limit=3, before=page1[-1].id)
    assert [r.id for r in page1 + page2] == sorted(ids, reverse=True)
    assert len(await store.list_runs("default", status="queued")) == 6
    assert await store.list_runs("default", status="running") == []
    assert await store.list_runs("elsewhere") == []


async def test_lease_is_won_once_and_stolen_only_when_expired(store: Store) -> None:
    run = await new_run(store)
    first = await store.acquire_lease(run.id, "w1", ttl=60)
    assert first is not None and first.epoch == 1
    assert await store.acquire_lease(run.id, "w2", ttl=60) is None
    assert await store.claim_runs("w2", 60, 10, ("queued",)) == []
    # The same worker id takes its own lease back at once, with a new epoch.
    again = await store.acquire_lease(run.id, "w1", ttl=0.05)
    assert again is not None and again.epoch == 2
    assert not await store.renew_lease(first, 60)
    await asyncio.sleep(0.1)
    stolen = await store.acquire_lease(run.id, "w2", ttl=60)
    assert stolen is not None and stolen.epoch == 3
    assert not await store.renew_lease(again, 60)
    assert await store.renew_lease(stolen, 60)


async def test_release_keeps_the_epoch_so_stale_writers_stay_fenced(store: Store) -> None:
    run = await new_run(store)
    lease = await store.acquire_lease(run.id, "w1", ttl=60)
    assert lease is not None
    await store.release_lease(lease)
    taken = await store.claim_runs("w2", 60, 10, ("queued",))
    assert [(t.run_id, t.epoch) for t in taken] == [(run.id, 2)]
    with pytest.raises(LeaseLost):
        await store.append(Append(lease, (ev(1, "run_started"),)))
    assert await store.events(run.id) == []


async def test_claim_runs_takes_oldest_unleased_up_to_limit(store: Store) -> None:
    runs = [await new_run(store) for _ in range(3)]
    await store.acquire_lease(runs[0].id, "other", ttl=60)
    won = await store.claim_runs("w1", 60, 1, ("queued",))
    assert [w.run_id for w in won] == [runs[1].id]
    assert await store.runs_leased_by("w1") == [runs[1].id]


async def test_append_writes_events_and_run_update_together(store: Store) -> None:
    run = await new_run(store)
    lease = await store.acquire_lease(run.id, "w1", ttl=60)
    assert lease is not None
    await store.append(Append(lease, (ev(1, "run_started"),), RunUpdate("running")))
    w = EventWriter(run.id, 1)
    done = (
        w.event("step_started", step_id="s"),
        w.completed("s", 1, {"ok": True}),
        w.event("run_succeeded", {"output": {"ok": True}}),
    )
    await store.append(Append(lease, done, RunUpdate("succeeded", output={"ok": True})))
    loaded = await store.get_run(run.id)
    assert loaded is not None and (loaded.status, loaded.output) == ("succeeded", {"ok": True})
    events = await store.events(run.id)
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert [e.kind for e in events] == [
        "run_started",
        "step_started",
        "step_completed",
        "run_succeeded",
    ]
    assert events[2].data == {"output": {"ok": True}} and events[2].step_id == "s"
    assert [e.seq for e in await store.events(run.id, after=2)] == [3, 4]


async def test_a_second_step_completed_is_impossible(store: Store) -> None:
    run = await new_run(store)
    lease = await store.acquire_lease(run.id, "w1", ttl=60)
    assert lease is not None
    await store.append(Append(lease, (ev(1, "step_completed", "s", output=1),)))
    with pytest.raises(StoreError):
        await store.append(
            Append(
                lease, (ev(2, "step_completed", "s", output=2),), RunUpdate("succeeded", output=2)
            )
        )
    # Nothing of the refused append landed, the run update included.
    assert [e.seq for e in await store.events(run.id)] == [1]
    assert (await store.get_run(run.id)).status == "queued"  # type: ignore[union-attr]


async def test_a_writer_that_lost_its_lease_is_refused(store: Store) -> None:
    run = await new_run(store)
    old = await store.acquire_lease(run.id, "w1", ttl=0.05)
    assert old is not None
    await store.append(Append(old, (ev(1, "run_started"),), RunUpdate("running")))
    await asyncio.sleep(0.1)
    new = await store.acquire_lease(run.id, "w2", ttl=60)
    assert new is not None
    with pytest.raises(LeaseLost):
        await store.append(Append(old, (ev(2, "step_started", "s"),), RunUpdate("failed")))
    await store.append(Append(new, (ev(2, "run_recovered"),)))
    assert [e.kind for e in await store.events(run.id)] == ["run_started", "run_recovered"]
    assert (await store.get_run(run.id)).status == "running"  # type: ignore[union-attr]


async def test_group_commit_isolates_each_writers_outcome(store: Store) -> None:
    runs = [await new_run(store) for _ in range(12)]
    leases = [await store.acquire_lease(r.id, "w1", ttl=60) for r in runs]
    assert all(leases)
    stale = await store.acquire_lease(runs[0].id, "w1", ttl=60)  # fences leases[0]
    assert stale is not None

    async def write(i: int) -> str:
        lease = leases[i]
        assert lease is not None
        try:
            await store.append(Append(lease, (ev(1, "run_started"),), RunUpdate("running")))
        except LeaseLost:
            return "lost"
        return "ok"

    outcomes = await asyncio.gather(*(write(i) for i in range(12)))
    assert outcomes == ["lost"] + ["ok"] * 11
    assert await store.events(runs[0].id) == []
    assert all([len(await store.events(r.id)) == 1 for r in runs[1:]])


async def test_large_outputs_are_stored_once_and_referenced(store: Store) -> None:
    run = await new_run(store)
    lease = await store.acquire_lease(run.id, "w1", ttl=60)
    assert lease is not None
    big = {"text": "x" * 100_000}
    w = EventWriter(run.id)
    await store.append(Append(lease, (w.completed("a", 1, big), w.completed("b", 1, big))))
    listed = await store.events(run.id)
    assert all("outputRef" in e.data and e.blob is None for e in listed)
    assert all(len(str(e.data)) < 200 for e in listed)
    state = fold(await store.events(run.id, blobs=True))
    assert state.outputs == {"a": big, "b": big}


async def test_open_is_idempotent_and_reapplies_nothing(database_url: str) -> None:
    from lantern.store import open_store

    for _ in range(2):
        s = open_store(database_url)
        await s.open()
        await s.put_agent("default", "a", DEFINITION)
        await s.close()
    s = open_store(database_url)
    await s.open()
    assert (await s.get_agent("default", "a")).version == 2  # type: ignore[union-attr]
    await s.close()


async def test_a_finishing_append_releases_the_lease_in_the_same_transaction(store: Store) -> None:
    run = await new_run(store)
    lease = await store.acquire_lease(run.id, "w1", ttl=600)
    assert lease is not None
    await store.append(Append(lease, (ev(1, "run_started"),), RunUpdate("running")))
    assert await store.acquire_lease(run.id, "w2", ttl=60) is None
    await store.append(Append(lease, (ev(2, "run_failed"),), RunUpdate("failed", error={"x": 1})))
    taken = await store.acquire_lease(run.id, "w2", ttl=60)
    assert taken is not None and taken.epoch == 2


async def test_start_run_leases_and_opens_a_fresh_run_in_one_transaction(store: Store) -> None:
    run = await new_run(store)
    opening = (ev(1, "run_started"), ev(2, "step_started", "s"))
    lease = await store.start_run(run.id, "w1", 60, opening, RunUpdate("running"))
    assert lease is not None and (lease.worker_id, lease.epoch) == ("w1", 1)
    assert (await store.get_run(run.id)).status == "running"  # type: ignore[union-attr]
    assert [e.kind for e in await store.events(run.id)] == ["run_started", "step_started"]
    # Started once: neither another worker nor the same one can start it again.
    for worker in ("w2", "w1"):
        assert await store.start_run(run.id, worker, 60, opening, RunUpdate("running")) is None
    assert len(await store.events(run.id)) == 2
    await store.append(Append(lease, (ev(3, "step_completed", "s", output=1),)))


async def test_start_run_writes_nothing_while_another_holds_the_lease(store: Store) -> None:
    run = await new_run(store)
    assert await store.acquire_lease(run.id, "w1", ttl=60) is not None
    opening = (ev(1, "run_started"),)
    assert await store.start_run(run.id, "w2", 60, opening, RunUpdate("running")) is None
    assert await store.events(run.id) == []
    assert (await store.get_run(run.id)).status == "queued"  # type: ignore[union-attr]


async def test_recover_orphans_steals_only_absent_or_expired_leases(store: Store) -> None:
    runs = [await new_run(store) for _ in range(4)]
    live = await store.acquire_lease(runs[0].id, "alive", ttl=60)
    expired = await store.acquire_lease(runs[1].id, "dead", ttl=0.05)
    assert live is not None and expired is not None
    await store.append(Append(expired, (ev(1, "run_started"),), RunUpdate("running")))
    finished = await store.acquire_lease(runs[3].id, "w", ttl=60)
    assert finished is not None
    await store.append(Append(finished, (ev(1, "run_failed"),), RunUpdate("failed")))
    await asyncio.sleep(0.1)
    found = await store.recover_orphans("sweeper", 60, 20)
    by_run = {o.run_id: o for o in found}
    assert set(by_run) == {runs[1].id, runs[2].id}  # not the live one, not the finished one
    stolen = by_run[runs[1].id]
    assert stolen.lease is not None and stolen.lease.epoch == 2
    assert stolen.previous_worker == "dead" and stolen.expired_at is not None
    fresh = by_run[runs[2].id]
    assert fresh.lease is not None and fresh.previous_worker is None and fresh.expired_at is None
    assert await store.recover_orphans("other", 60, 20) == []  # they are leased now
    with pytest.raises(LeaseLost):
        await store.append(Append(expired, (ev(2, "step_started", "s"),)))


async def test_recover_orphans_takes_the_oldest_first_up_to_the_limit(store: Store) -> None:
    runs = [await new_run(store) for _ in range(5)]
    found = await store.recover_orphans("sweeper", 60, 2)
    assert [o.run_id for o in found] == [runs[0].id, runs[1].id]


async def test_workers_heartbeat_and_show_the_runs_they_hold(store: Store) -> None:
    started = datetime.now(UTC)
    await store.heartbeat("w1", started)
    await store.heartbeat("w2", started)
    run = await new_run(store)
    assert await store.acquire_lease(run.id, "w1", ttl=60) is not None
    await store.worker_stopped("w2")
    workers = {w.id: w for w in await store.list_workers()}
    assert workers["w1"].runs == (run.id,) and workers["w1"].stopped_at is None
    assert workers["w2"].runs == () and workers["w2"].stopped_at is not None
    assert workers["w1"].heartbeat_at >= started - timedelta(seconds=1)


async def test_a_delivery_is_claimed_once_and_its_outcome_kept(store: Store) -> None:
    from lantern.store.records import Delivery

    run = await new_run(store)
    lease = await store.acquire_lease(run.id, "w1", ttl=60)
    assert lease is not None
    claim = Delivery(run.id, "s", "mail", 1, "k" * 64, "email", "ada@example.test")
    first = await store.claim_delivery(lease, claim)
    assert first.status == "claimed" and first.claimed_at is not None
    again = await store.claim_delivery(lease, claim)  # claimed, no outcome: a crash mid-send
    assert again.status == "claimed"
    await store.finish_delivery(lease, first, "delivered", {"accepted": True})
    done = await store.claim_delivery(lease, claim)
    assert (done.status, done.response) == ("delivered", {"accepted": True})
    failing = Delivery(run.id, "s", "post", 1, "k" * 64, "http", None)
    await store.finish_delivery(lease, await store.claim_delivery(lease, failing), "failed", {})
    retaken = await store.claim_delivery(
        lease, Delivery(run.id, "s", "post", 2, "j" * 64, "http", None)
    )
    assert (retaken.status, retaken.attempt) == ("claimed", 2)
    listed = await store.deliveries(run.id)
    assert [(d.name, d.status) for d in listed] == [("mail", "delivered"), ("post", "claimed")]


async def test_a_delivery_claim_is_fenced_by_the_lease(store: Store) -> None:
    from lantern.store.records import Delivery

    run = await new_run(store)
    old = await store.acquire_lease(run.id, "w1", ttl=60)
    assert old is not None
    claim = Delivery(run.id, "s", "mail", 1, "k" * 64, "email", None)
    receipt = await store.claim_delivery(old, claim)
    new = await store.acquire_lease(run.id, "w1", ttl=60)  # a new epoch takes over
    assert new is not None
    with pytest.raises(LeaseLost):
        await store.claim_delivery(old, claim)
    with pytest.raises(LeaseLost):
        await store.finish_delivery(old, receipt, "delivered", {})
    assert [d.status for d in await store.deliveries(run.id)] == ["claimed"]


async def test_conflicts_are_told_apart_by_the_constraint_violated(store: Store) -> None:
    """A reused idempotency key is a Conflict (runs_by_idempotency_key); another unique
    violation of the same insert, a run id used twice, is a store failure, not a Conflict."""
    first = await new_run(store)
    again = Run(
        id="run_" + "9" * 28,
        workspace="default",
        agent_name="a",
        agent_version=0,
        status="queued",
        input={},
        output=None,
        error=None,
        created_at=datetime.now(UTC),
        updated_at=datetime.now(UTC),
    )
    await store.create_run(again, idempotency_key="k-1", request_digest="d")
    with pytest.raises(Conflict, match="idempotency key 'k-1' was already used"):
        await store.create_run(
            replace(again, id="run_" + "8" * 28), idempotency_key="k-1", request_digest="d"
        )
    with pytest.raises(StoreError) as raised:
        await store.create_run(replace(again, id=first.id), idempotency_key="k-2")
    assert not isinstance(raised.value, Conflict)
