"""LeaseStore: leases, claims, the recovery sweep and workers, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from lantern.errors import LeaseLost
from lantern.store import Append, RunUpdate, Store
from lantern.store.postgres import leases as pg_leases
from tests.conformance.helpers import ev, new_run


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


async def test_a_claim_passes_by_the_queued_runs_it_is_told_to_skip(store: Store) -> None:
    mine, other = await new_run(store), await new_run(store)
    taken = await store.claim_runs("w1", 60, 10, ("queued",), skip={mine.id})
    assert [t.run_id for t in taken] == [other.id]
    # Skipped, not leased: another claim (or this one's next) still takes it.
    assert [t.run_id for t in await store.claim_runs("w2", 60, 10, ("queued",))] == [mine.id]


@asynccontextmanager
async def claims_locked(store: Store) -> AsyncIterator[None]:
    """Another replica in the middle of a claim: PostgreSQL's claim lock held, or SQLite's
    write lock (its claims are write transactions)."""
    if store.url.startswith("sqlite"):
        other = sqlite3.connect(store.url.removeprefix("sqlite:///"), isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            other.execute("ROLLBACK")
            other.close()
        return
    async with await psycopg.AsyncConnection.connect(store.url, autocommit=True) as conn:
        await conn.execute("SELECT pg_advisory_lock(%s)", (pg_leases._CLAIM_LOCK,))
        yield


async def test_an_idle_claim_waits_for_no_other_claim(store: Store) -> None:
    """A replica's dispatcher claims every 0.2 s when it has nothing to do: with nothing
    queued nor due it reads that and takes no lock, so idle replicas do not queue behind one
    another's claims (nor, on SQLite, behind a writer)."""
    async with claims_locked(store):
        began = time.monotonic()
        assert await asyncio.wait_for(store.claim_runs("w2", 60, 10, ("queued",)), 10) == []
        assert time.monotonic() - began < 2
    run = await new_run(store)  # something to take: the claim takes it, under the lock
    assert [t.run_id for t in await store.claim_runs("w2", 60, 10, ("queued",))] == [run.id]
