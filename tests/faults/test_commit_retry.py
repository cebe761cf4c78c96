"""A journal append sent again (its first answer lost) lands once: its events carry their
sequence and hash, so the second sending finds itself stored and succeeds; a different
event at the same sequence is still refused. Both backends."""

from __future__ import annotations

import pytest

from lantern.engine.journal import EventWriter
from lantern.errors import StoreError
from lantern.store import Append, RunUpdate, Store
from tests.conformance.helpers import new_run


async def test_an_append_sent_twice_lands_once(store: Store) -> None:
    run = await new_run(store)
    lease = await store.acquire_lease(run.id, "w1", ttl=60)
    assert lease is not None
    w = EventWriter(run.id)
    batch = Append(lease, (w.event("run_started"), w.event("step_started", step_id="s")))
    await store.append(batch)
    await store.append(batch)  # as a retry after a lost answer would
    assert [e.seq for e in await store.events(run.id)] == [1, 2]
    finish = Append(lease, (w.event("run_succeeded", {"output": 1}),), RunUpdate("succeeded"))
    await store.append(finish)
    await store.append(finish)
    assert [e.kind for e in await store.events(run.id)][-1] == "run_succeeded"
    assert len(await store.events(run.id)) == 3
    stored = await store.get_run(run.id)
    assert stored is not None and stored.status == "succeeded"


async def test_another_event_at_a_stored_sequence_is_refused(store: Store) -> None:
    run = await new_run(store)
    lease = await store.acquire_lease(run.id, "w1", ttl=60)
    assert lease is not None
    await store.append(Append(lease, (EventWriter(run.id).event("run_started"),)))
    other = EventWriter(run.id).event("run_started", {"worker": "someone else"})
    with pytest.raises(StoreError):
        await store.append(Append(lease, (other,)))
    assert len(await store.events(run.id)) == 1
