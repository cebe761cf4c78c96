"""A replica frozen in the middle of a claim on PostgreSQL (SIGSTOP, a paused VM) does not stall
every other replica's claims: its claim transaction holds the claim lock, and PostgreSQL ends
that session once it has sat idle for the claim's limit, which frees the lock. SQLite has one
writer and no claim lock shared across hosts, so the case does not arise there.
"""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from lantern.store import Store
from lantern.store.postgres import leases
from tests.conformance.helpers import new_run


@pytest.fixture
def database_url(pg_url: str) -> str:
    return pg_url  # PostgreSQL only, for the shared store fixture


async def test_a_replica_frozen_in_its_claim_does_not_stall_the_others(
    store: Store, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leases, "IDLE_CLAIM_LIMIT_MS", 1_000)
    run = await new_run(store)
    # The frozen replica: its claim took the lock with the claim's own statement, then stopped
    # sending anything, as a process stopped between two of the claim's statements does.
    frozen = await psycopg.AsyncConnection.connect(database_url)
    try:
        await frozen.execute("BEGIN")
        await frozen.execute(leases._LOCK, (leases._CLAIM_LOCK, str(leases.IDLE_CLAIM_LIMIT_MS)))
        started = time.monotonic()
        taken = await asyncio.wait_for(store.claim_runs("w2", 60, 10, ("queued",)), 10)
        assert [t.run_id for t in taken] == [run.id]
        assert time.monotonic() - started < 5
        # The frozen replica, thawed, finds its session ended rather than a claim half-made.
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            await frozen.execute("SELECT 1")
    finally:
        await frozen.close()
