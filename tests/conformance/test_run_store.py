"""RunStore: agent versions, runs and their listing, idempotency conflicts, and opening the store,
on SQLite and PostgreSQL alike."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from lantern.engine.runs import create_run
from lantern.errors import Conflict, StoreError
from lantern.store import Run, Store
from tests.conformance.helpers import DEFINITION, new_run


async def test_agent_versions_are_immutable_and_numbered(store: Store) -> None:
    v1 = await store.put_agent("default", "a", {**DEFINITION, "v": 1})
    v2 = await store.put_agent("default", "a", {**DEFINITION, "v": 2})
    assert (v1.version, v2.version) == (1, 2)
    saved = await store.get_agent("default", "a", 1)
    assert saved is not None and saved.definition["v"] == 1
    saved = await store.get_agent("default", "a")
    assert saved is not None and saved.definition["v"] == 2
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


async def test_open_is_idempotent_and_reapplies_nothing(database_url: str) -> None:
    from lantern.store import open_store

    for _ in range(2):
        s = open_store(database_url)
        await s.open()
        await s.put_agent("default", "a", DEFINITION)
        await s.close()
    s = open_store(database_url)
    await s.open()
    saved = await s.get_agent("default", "a")
    assert saved is not None and saved.version == 2
    await s.close()


async def test_a_runs_detail_is_the_run_its_children_and_its_key_read_at_once(
    store: Store,
) -> None:
    parent = await new_run(store)
    keyed = await create_run(store, "a", {"n": 2}, idempotency_key="order-7")
    children = [
        await create_run(store, "a", {"c": n}, parent_id=parent.id, run_id=f"{parent.id[:20]}{n}")
        for n in (3, 1, 2)
    ]

    detail = await store.run_detail(parent.id)
    assert detail is not None
    assert detail.run == await store.get_run(parent.id)
    assert detail.children == [c.id for c in await store.children(parent.id)]
    assert sorted(detail.children) == detail.children == sorted(c.id for c in children)
    assert detail.idempotency_key is None

    leaf = await store.run_detail(keyed.id)
    assert leaf is not None and (leaf.children, leaf.idempotency_key) == ([], "order-7")
    assert leaf.idempotency_key == await store.run_key(keyed.id)
    assert await store.run_detail("run_missing") is None
