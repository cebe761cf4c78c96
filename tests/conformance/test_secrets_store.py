"""The store's secrets and per-workspace counts, on both backends."""

from __future__ import annotations

from datetime import UTC, datetime

from lantern.engine.runs import apply_agent
from lantern.store import Store
from lantern.store.records import Run

AGENT = {"name": "a", "graph": {"nodes": [{"id": "start", "type": "trigger"}], "edges": []}}


async def test_secrets_are_kept_per_workspace_as_given(store: Store) -> None:
    first = await store.put_secret("w1", "TOKEN", "kid1", b"\x00sealed\xff")
    again = await store.put_secret("w1", "TOKEN", "kid2", b"other")
    assert again.created_at == first.created_at and again.updated_at >= first.updated_at
    await store.put_secret("w2", "TOKEN", "kid1", b"theirs")
    assert [s.name for s in await store.list_secrets("w1")] == ["TOKEN"]
    [sealed] = await store.sealed_secrets("w1")
    assert (sealed.key_id, sealed.sealed) == ("kid2", b"other")
    assert await store.delete_secret("w1", "TOKEN") is True
    assert await store.delete_secret("w1", "TOKEN") is False
    assert await store.list_secrets("w1") == []
    assert [s.sealed for s in await store.sealed_secrets("w2")] == [b"theirs"]


async def test_queued_counts_and_workspace_membership(store: Store) -> None:
    await apply_agent(store, AGENT, "w1")
    await apply_agent(store, AGENT, "w2")
    now = datetime.now(UTC)
    ids = []
    for i, ws in enumerate(["w1", "w1", "w1", "w2"]):
        run = Run(f"run_q_{i}", ws, "a", 0, "queued", {}, None, None, now, now)
        ids.append((await store.create_run(run)).id)
    assert await store.queued_count("w1", 10) == 3
    assert await store.queued_count("w1", 2) == 2  # counts no further than asked
    assert await store.queued_count("w3", 10) == 0
    assert await store.runs_in_workspace("w2", ids) == {"run_q_3"}
    # Fair claiming: the one run of w2 comes before w1's second and third.
    claimed = await store.claim_runs("wk", 60, 2, ("queued",))
    assert {c.run_id for c in claimed} == {"run_q_0", "run_q_3"}
