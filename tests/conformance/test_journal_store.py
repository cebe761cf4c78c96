"""JournalStore: fenced appends, opening a run, large outputs and deliveries, on SQLite and
PostgreSQL alike."""

from __future__ import annotations

import asyncio

import pytest

from lantern.engine.journal import EventWriter, fold
from lantern.errors import Conflict, LeaseLost, NotFound, StoreError
from lantern.store import Append, Lease, Run, RunUpdate, Store
from lantern.store.records import RunFlow
from tests.conformance.helpers import DEFINITION, ev, fresh, new_run


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
    stored = await store.get_run(run.id)
    assert stored is not None and stored.status == "queued"


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
    stored = await store.get_run(run.id)
    assert stored is not None and stored.status == "running"


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


async def test_a_superseded_writer_is_refused_beside_the_current_one_in_one_group_commit(
    store: Store,
) -> None:
    # Two writers of one run whose appends share a group commit (submitted together): the
    # current epoch's lands, the superseded one's is refused and leaves nothing behind, its
    # run update included. PostgreSQL fenced a batch per run, not per (run, epoch), so the
    # stale append landed too and was told it had.
    run = await new_run(store)
    old = await store.acquire_lease(run.id, "w1", ttl=60)
    new = await store.acquire_lease(run.id, "w1", ttl=60)  # the same worker id takes it back
    assert old is not None and new is not None and new.epoch > old.epoch
    outcomes = await asyncio.gather(
        store.append(Append(new, (ev(1, "run_recovered"),))),
        store.append(Append(old, (ev(2, "step_started", "s"),), RunUpdate("failed"))),
        return_exceptions=True,
    )
    assert outcomes[0] is None and isinstance(outcomes[1], LeaseLost)
    assert [e.kind for e in await store.events(run.id)] == ["run_recovered"]
    stored = await store.get_run(run.id)
    assert stored is not None and stored.status == "queued"


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
    stored = await store.get_run(run.id)
    assert stored is not None and stored.status == "running"
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
    stored = await store.get_run(run.id)
    assert stored is not None and stored.status == "queued"


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


async def test_start_new_run_stores_leases_and_opens_a_run_in_one_transaction(
    store: Store,
) -> None:
    """The create of a run its replica drives at once (lantern/engine/new_run.py): stored
    running, leased, its opening journaled; and declined (stored queued, nothing more) for a
    version newer than its opening was made for or under flow control, which only a claim
    may start (``claims.admits``). Any kind of run driven in-process opens this way."""
    await store.put_agent("default", "a", DEFINITION)
    opening = (ev(1, "run_started"), ev(2, "step_started", "s"))

    async def start(run: Run, key: str | None = None) -> tuple[Run, Lease | None]:
        return await store.start_new_run(
            run,
            idempotency_key=key,
            request_digest="d",
            flow=lambda concurrency, max_runs: RunFlow("k", 1, max_runs),
            worker_id="w1",
            ttl=60,
            events=opening,
            update=RunUpdate("running"),
        )

    stored, lease = await start(fresh("a", 1), key="k1")
    assert lease is not None and (lease.worker_id, lease.epoch) == ("w1", 1)
    assert (stored.status, stored.agent_version) == ("running", 1)
    read = await store.get_run(stored.id)
    assert read is not None and (read.status, read.agent_version) == ("running", 1)
    assert [e.kind for e in await store.events(stored.id)] == ["run_started", "step_started"]
    assert await store.acquire_lease(stored.id, "w2", ttl=60) is None  # held by w1
    assert await store.runs_leased_by("w1") == [stored.id]  # what a restart of w1 takes back
    # The same idempotency key: a Conflict, and nothing of the second run stored.
    twin = fresh("a", 1)
    with pytest.raises(Conflict):
        await start(twin, key="k1")
    assert await store.get_run(twin.id) is None and await store.events(twin.id) == []
    with pytest.raises(NotFound):
        await start(fresh("nobody", 1))

    # Version 2 applied since the opening was made for version 1: stored queued, pinned to 2.
    await store.put_agent("default", "a", DEFINITION)
    stale, none = await start(fresh("a", 1))
    assert none is None and (stale.status, stale.agent_version) == ("queued", 2)
    assert await store.events(stale.id) == []
    assert (await store.get_run(stale.id)).status == "queued"  # type: ignore[union-attr]

    # Under flow control: stored queued with its key, for a claim to admit.
    await store.put_agent("default", "f", {**DEFINITION, "name": "f", "maxConcurrentRuns": 1})
    held, none = await start(fresh("f", 1))
    assert none is None and held.status == "queued"
    assert held.flow is not None and held.flow.key == "k"
    assert await store.events(held.id) == [] and await store.runs_leased_by("w1") == [stored.id]
