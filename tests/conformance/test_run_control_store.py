"""Parked runs, decisions, children and the usage baseline, on SQLite and PostgreSQL alike."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from lantern.engine.runs import create_run
from lantern.store import Append, RunUpdate, Store
from lantern.store.records import Decision
from tests.conformance.helpers import ev, new_run


async def test_a_parked_run_holds_no_lease_and_is_claimed_once_woken(store: Store) -> None:
    run = await new_run(store)
    [lease] = await store.claim_runs("w1", 60, 10, ("queued",))
    await store.append(Append(lease, (ev(1, "run_started"),), RunUpdate("running")))
    await store.append(Append(lease, (), RunUpdate("waiting")))  # a park writes no event
    parked = await store.get_run(run.id)
    assert parked is not None and parked.status == "waiting"
    # Given up with the commit that parked it: a late renewal cannot take it back.
    assert not await store.renew_lease(lease, 60)
    assert all(run.id not in w.runs for w in await store.list_workers())
    assert await store.claim_runs("w2", 60, 10, ("queued",)) == []  # not due
    await store.wake(run.id)
    [again] = await store.claim_runs("w2", 60, 10, ("queued",))
    assert (again.run_id, again.worker_id, again.epoch) == (run.id, "w2", lease.epoch + 1)
    assert await store.claim_runs("w3", 60, 10, ("queued",)) == []  # w2 holds it now


async def test_a_parked_run_with_a_wake_time_is_due_then(store: Store) -> None:
    run = await new_run(store)
    [lease] = await store.claim_runs("w1", 60, 10, ("queued",))
    soon = datetime.now(UTC) - timedelta(seconds=1)
    await store.append(Append(lease, (ev(1, "run_started"),), RunUpdate("waiting", wake_at=soon)))
    [again] = await store.claim_runs("w2", 60, 10, ("queued",))
    assert again.run_id == run.id


async def test_a_decision_is_made_once(store: Store) -> None:
    run = await new_run(store)
    first = Decision(run.id, "ok", "approved", "key:ada", "fine")
    assert await store.decide(first)
    assert not await store.decide(Decision(run.id, "ok", "rejected", "key:bob"))
    stored = (await store.decisions(run.id))["ok"]
    assert (stored.decision, stored.decided_by, stored.comment) == ("approved", "key:ada", "fine")
    assert stored.decided_at is not None


async def test_a_finished_child_wakes_its_parked_parent(store: Store) -> None:
    parent = await new_run(store)
    [plea] = await store.claim_runs("w1", 60, 10, ("queued",))
    await store.append(Append(plea, (ev(1, "run_started"),), RunUpdate("waiting")))
    child = await create_run(store, "a", {}, run_id=parent.id[:16] + "c" * 16, parent_id=parent.id)
    assert [c.id for c in await store.children(parent.id)] == [child.id]
    child_run = await store.get_run(child.id)
    assert child_run is not None and child_run.parent_id == parent.id
    [clea] = await store.claim_runs("w1", 60, 10, ("queued",))
    assert clea.run_id == child.id
    assert await store.claim_runs("w1", 60, 10, ("queued",)) == []
    await store.append(Append(clea, (ev(1, "run_succeeded"),), RunUpdate("succeeded", output=1)))
    [woken] = await store.claim_runs("w1", 60, 10, ("queued",))
    assert woken.run_id == parent.id


async def test_recent_step_usage_reads_the_agents_succeeded_runs(store: Store) -> None:
    usage = {"inputTokens": 5, "outputTokens": 1, "costUsd": 0.01}
    for status in ("succeeded", "failed"):
        await new_run(store)
        [lease] = await store.claim_runs("w1", 60, 10, ("queued",))
        events = (
            ev(1, "step_completed", "m", output={"usage": usage, "text": "hi"}),
            ev(2, "step_completed", "t", output={"plain": True}),
        )
        await store.append(Append(lease, events, RunUpdate(status)))
    [succeeded] = await store.list_runs("default", status="succeeded")
    assert await store.recent_step_usage("default", "a") == [(succeeded.id, "m", usage)]
    assert await store.recent_step_usage("default", "other") == []
