"""A cancellation whose commit fails gives back the lease it took, so the run is not stranded
for a lease TTL: the database itself refuses the journal write (a trigger, on both backends),
and on PostgreSQL the same failure also terminates the store's other connections
(``pg_terminate_backend``), so the lease's release meets a dead pooled connection first.
Once the database accepts writes again, cancelling again finishes the run at once."""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import AsyncIterator

import psycopg
import pytest

from lantern.engine.cancel import cancel_run
from lantern.store import Store, open_store
from tests.conformance.helpers import new_run

TTL = 600.0  # far longer than the test: a lease given back is free now, not after it expires

SQLITE_REFUSE = """
CREATE TRIGGER refuse_journal BEFORE INSERT ON journal_events
BEGIN SELECT RAISE(ABORT, 'the journal refuses writes'); END
"""

# Run by the writer's connection inside the failing INSERT: it ends every other connection
# of this store (they share the test's application_name), then refuses the write.
POSTGRES_REFUSE = """
CREATE FUNCTION refuse_journal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_terminate_backend(pid) FROM pg_stat_activity
     WHERE application_name = current_setting('application_name') AND pid <> pg_backend_pid();
    RAISE EXCEPTION 'the journal refuses writes';
END $$;
CREATE TRIGGER refuse_journal BEFORE INSERT ON journal_events
    FOR EACH ROW EXECUTE FUNCTION refuse_journal();
"""


@pytest.fixture
def url(database_url: str) -> str:
    if database_url.startswith("sqlite"):
        return database_url
    # A name of its own, so the trigger terminates this store's connections and nobody else's.
    return f"{database_url}&application_name=cancel_{secrets.token_hex(4)}"


@pytest.fixture
async def opened(url: str) -> AsyncIterator[Store]:
    s = open_store(url)
    await s.open()
    yield s
    await s.close()


def refuse(url: str, on: bool) -> None:
    """Make the database refuse (or accept again) every journal write, from outside the store."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute(SQLITE_REFUSE if on else "DROP TRIGGER refuse_journal")
        return
    with psycopg.connect(url, autocommit=True) as conn:
        if on:
            conn.execute(POSTGRES_REFUSE)
        else:
            conn.execute("DROP TRIGGER refuse_journal ON journal_events")


async def test_a_cancel_whose_commit_fails_gives_its_lease_back(opened: Store, url: str) -> None:
    run = await new_run(opened)
    refuse(url, True)
    with pytest.raises(Exception, match="the journal refuses writes"):
        await cancel_run(opened, run.id, "api", TTL)
    refuse(url, False)
    assert await opened.events(run.id) == []  # nothing of the refused commit landed
    # The lease the failed cancel took is free again, not held for the TTL: cancelling again
    # takes it and finishes the run now (a lease still held would leave it only flagged).
    cancelled = await cancel_run(opened, run.id, "api", TTL)
    assert cancelled.status == "cancelled"
    assert [e.kind for e in await opened.events(run.id)] == ["run_cancelled"]
