"""A run's start (``start_run``: its lease and opening in one statement) beside a claim of the
same workspace or the same run on PostgreSQL: it neither waits for the claim's commit nor
deadlocks with it. SQLite has one writer, so a start and a claim never interleave there.

Before: every start marked its workspace served with an upsert of one row, so the starts of
a workspace (32 runs created at once) went in single file, each behind the one before's
commit; and a start that leased the run before locking its row deadlocked with a claim that
had locked the row and then leased it (PostgreSQL broke it after deadlock_timeout, 1 s).
"""

from __future__ import annotations

import asyncio
import secrets
import time

import psycopg
import pytest

from lantern.store import RunUpdate, Store
from tests.conformance.helpers import ev, new_run

TTL = 60.0


@pytest.fixture
def database_url(pg_url: str) -> str:
    # PostgreSQL only, for the shared store fixture; with a name of its own, so this store's
    # sessions are found in pg_stat_activity by it.
    return f"{pg_url}&application_name=start_{secrets.token_hex(4)}"


async def start(store: Store, run_id: str, worker: str = "w1") -> object:
    return await store.start_run(run_id, worker, TTL, (ev(1, "run_started"),), RunUpdate("running"))


async def test_a_start_does_not_wait_for_a_claim_serving_its_workspace(
    store: Store, database_url: str
) -> None:
    first, second = await new_run(store), await new_run(store)
    assert await start(store, first.id) is not None  # its workspace is marked served
    async with await psycopg.AsyncConnection.connect(database_url) as claim:
        # A claim of the same workspace, between marking it served and its commit.
        await claim.execute(
            "UPDATE workspace_claims SET claimed_at = now() WHERE workspace = 'default'"
        )
        lease = await asyncio.wait_for(start(store, second.id), 5)
        assert lease is not None
        await claim.rollback()
    stored = await store.get_run(second.id)
    assert stored is not None and stored.status == "running"


async def test_a_start_and_a_claim_of_the_same_run_do_not_deadlock(
    store: Store, database_url: str
) -> None:
    run = await new_run(store)
    async with await psycopg.AsyncConnection.connect(database_url) as claim:
        # A claim that chose the run: its row locked, its lease about to be written.
        await claim.execute("SELECT id FROM runs WHERE id = %s FOR NO KEY UPDATE", (run.id,))
        starting = asyncio.create_task(start(store, run.id))
        app = database_url.rsplit("application_name=", 1)[1]
        deadline = time.monotonic() + 10
        while True:  # the start is waiting on the claim's lock
            cur = await claim.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()",
                (app,),
            )
            row = await cur.fetchone()
            if row is not None and row[0] > 0:
                break
            assert time.monotonic() < deadline, "the start never waited on the claim"
            await asyncio.sleep(0.02)
        await claim.execute(
            "INSERT INTO run_locks (run_id, worker_id, expires_at, epoch, workspace, agent_name)"
            " SELECT id, 'w2', now() + interval '60 seconds', 1, workspace, agent_name"
            " FROM runs WHERE id = %s",
            (run.id,),
        )
        await claim.commit()
        # The claim won: the start writes nothing (no deadlock error on either side).
        assert await asyncio.wait_for(starting, 10) is None
    assert await store.events(run.id) == []
