"""The numbers /metrics reads at each scrape, on both backends: unfinished runs by workspace
and status, live leases, and when the longest-queued run was created."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from lantern.engine.runs import apply_agent, create_run
from lantern.store import Store
from tests.api.test_operate import REVIEW


async def test_gauges_count_unfinished_runs_leases_and_the_oldest_queued(store: Store) -> None:
    empty = await store.gauges()
    assert empty.runs == {} and empty.leases_held == 0 and empty.oldest_queued is None
    await apply_agent(store, REVIEW, "acme")
    first = await create_run(store, "review", {}, "acme")
    await create_run(store, "review", {}, "acme")
    await apply_agent(store, REVIEW, "zeta")
    await create_run(store, "review", {}, "zeta")
    lease = await store.acquire_lease(first.id, "w1", 60)
    assert lease is not None
    found = await store.gauges()
    assert found.runs == {("acme", "queued"): 2, ("zeta", "queued"): 1}
    assert found.leases_held == 1
    assert found.oldest_queued is not None
    assert abs(found.oldest_queued - first.created_at) < timedelta(seconds=1)
    assert found.oldest_queued <= datetime.now(UTC)
    await store.release_lease(lease)
    assert (await store.gauges()).leases_held == 0
