"""SignalStore (docs/signals.md) on SQLite and PostgreSQL alike: stored in arrival order, one
per idempotency key, refused for a finished or unknown run or past the limit, a parked run
woken, and deleted with its run."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from lantern.errors import Conflict, NotFound
from lantern.ids import new_signal_id
from lantern.store import Append, RunUpdate, Store
from lantern.store.signals import Signal
from tests.conformance.helpers import ev, new_run


def made(run_id: str, name: str, payload: object) -> Signal:
    return Signal(new_signal_id(), run_id, name, payload, datetime.now(UTC))


async def add(
    store: Store, signal: Signal, key: str | None = None, digest: str = "d", limit: int = 10
) -> tuple[str, bool, str | None]:
    added = await store.add_signal(signal, idempotency_key=key, request_digest=digest, limit=limit)
    return added.signal.id, added.created, added.request_digest


async def test_signals_are_kept_in_arrival_order_one_per_key(store: Store) -> None:
    run = await new_run(store)
    other = await new_run(store)
    first = made(run.id, "pay", {"n": 1, "note": "ü"})
    assert await add(store, first, "k1", "d1") == (first.id, True, "d1")
    second = made(run.id, "pay", [2])
    await add(store, second)
    await add(store, made(run.id, "other", None))
    await add(store, made(other.id, "pay", 3), "k1")  # a key is per run
    # The same key again: the signal stored first, and its digest (the caller compares).
    assert await add(store, made(run.id, "pay", {"n": 9}), "k1", "d9") == (first.id, False, "d1")
    found = await store.signals(run.id, "pay")
    assert [(s.id, s.payload) for s in found] == [
        (first.id, {"n": 1, "note": "ü"}),
        (second.id, [2]),
    ]
    assert found[0].received_at <= found[1].received_at
    assert [s.payload for s in await store.signals(other.id, "pay")] == [3]
    assert await store.signals(run.id, "nothing") == []


async def test_a_finished_or_unknown_run_or_one_at_the_limit_takes_none(store: Store) -> None:
    with pytest.raises(NotFound):
        await add(store, made("run_" + "0" * 28, "pay", 1))
    full = await new_run(store)
    for n in range(2):
        await add(store, made(full.id, "pay", n), limit=2)
    with pytest.raises(Conflict, match="limit"):
        await add(store, made(full.id, "pay", 3), limit=2)
    done = await new_run(store)
    await add(store, made(done.id, "pay", 1), "k")
    lease = await store.acquire_lease(done.id, "w1", 60)
    assert lease is not None
    await store.append(Append(lease, (ev(1, "run_succeeded"),), RunUpdate("succeeded")))
    with pytest.raises(Conflict, match="finished"):
        await add(store, made(done.id, "pay", 2))
    # A retry of a send that was stored before the run finished still finds it.
    assert (await add(store, made(done.id, "pay", 1), "k"))[1] is False
    assert len(await store.signals(done.id, "pay")) == 1


async def test_a_signal_wakes_a_parked_run_and_is_deleted_with_it(store: Store) -> None:
    run = await new_run(store)
    lease = await store.acquire_lease(run.id, "w1", 60)
    assert lease is not None
    parking = (ev(1, "run_started"), ev(2, "step_waiting", "s", name="pay"))
    await store.append(Append(lease, parking, RunUpdate("waiting")))
    assert await store.claim_runs("w2", 60, 10, ("queued",)) == []  # parked, not due
    # The sender read the journal to seq 2 and saw no wait for its signal: not woken.
    await store.add_signal(
        made(run.id, "ship", 1), idempotency_key=None, request_digest=None, limit=10, wake_after=2
    )
    assert await store.claim_runs("w2", 60, 10, ("queued",)) == []
    # Read to seq 1 only: the journal moved on since, it may wait for it now: woken.
    await store.add_signal(
        made(run.id, "pay", 1), idempotency_key=None, request_digest=None, limit=10, wake_after=1
    )
    woken = await store.claim_runs("w2", 60, 10, ("queued",))
    assert [w.run_id for w in woken] == [run.id]
    # Claimed when woken, not opened yet: the claimer's runs to take back after a restart.
    assert await store.runs_leased_by("w2") == [run.id]
    end = (ev(3, "run_cancelled"),)
    await store.append(Append(woken[0], end, RunUpdate("cancelled")))
    deleted = await store.delete_runs([run.id])
    assert deleted.runs == (run.id,)
    assert await store.signals(run.id, "pay") == []
