"""Reading many runs and their journal heads at once (what a receipt batch signs over), on
SQLite and PostgreSQL alike: the same answers as one read per run."""

from __future__ import annotations

import json

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from lantern.engine.journal import EventWriter
from lantern.receipts.batch import ReceiptBatcher
from lantern.receipts.issue import Issuer
from lantern.receipts.keys import parse_pem, private_pem
from lantern.store import Append, Run, RunUpdate, Store
from tests.conformance.helpers import new_run


async def with_events(store: Store, n: int, *, finish: bool = False) -> Run:
    """A run whose journal holds ``n`` hash-chained events (finished by the last, if asked)."""
    run = await new_run(store)
    lease = await store.acquire_lease(run.id, "w1", ttl=60)
    assert lease is not None
    w = EventWriter(run.id)
    events = [w.event("run_started")] + [w.event("run_recovered") for _ in range(n - 2)]
    events.append(w.event("run_succeeded", {"output": n}) if finish else w.event("run_recovered"))
    update = RunUpdate("succeeded", output=n) if finish else RunUpdate("running")
    await store.append(Append(lease, tuple(events), update))
    stored = await store.get_run(run.id)
    assert stored is not None
    return stored


async def test_get_runs_answers_each_run_as_get_run_does_and_leaves_out_unknown_ids(
    store: Store,
) -> None:
    runs = [await new_run(store) for _ in range(3)]
    ids = [runs[2].id, "run_unknown", runs[0].id, runs[1].id]
    found = await store.get_runs(ids)
    assert set(found) == {r.id for r in runs}
    for run in runs:
        assert found[run.id] == await store.get_run(run.id)
    assert await store.get_runs([]) == {}
    assert await store.get_runs(["run_unknown"]) == {}


async def test_journal_heads_answer_each_run_as_journal_head_does(store: Store) -> None:
    short, long = await with_events(store, 2), await with_events(store, 7)
    empty = await new_run(store)  # queued: no events yet
    ids = [long.id, empty.id, short.id, "run_unknown"]
    heads = await store.journal_heads(ids)
    assert heads == {i: await store.journal_head(i) for i in ids}
    assert heads[empty.id] == heads["run_unknown"] == (0, None)
    events = await store.events(long.id)
    assert heads[long.id] == (7, events[-1].hash) and events[-1].hash is not None
    assert heads[short.id][0] == 2
    assert await store.journal_heads([]) == {}


async def test_more_ids_than_one_in_list_holds_are_all_read(store: Store) -> None:
    """Past any IN list's bound (the store splits it): the runs at its end are found too."""
    runs = [await with_events(store, 3) for _ in range(2)]
    ids = [f"run_unknown_{i}" for i in range(700)] + [r.id for r in runs]
    found = await store.get_runs(ids)
    assert set(found) == {r.id for r in runs}
    heads = await store.journal_heads(ids)
    assert len(heads) == len(ids)
    for run in runs:
        assert heads[run.id] == await store.journal_head(run.id) != (0, None)


async def test_a_batch_signs_what_one_read_per_run_signs(store: Store) -> None:
    """The batch's receipt of each run is the single path's, but for when it was issued."""
    issuer = Issuer(store, parse_pem(private_pem(Ed25519PrivateKey.generate()), "test"))
    runs = [await with_events(store, n, finish=True) for n in (2, 5, 3)]
    unfinished = await with_events(store, 4)
    for key in issuer.ring.keys:
        await store.register_signing_key(key.kid, key.x)
    singly = {r.id: json.loads((await issuer.sign(r)).body) for r in runs}
    async with ReceiptBatcher(issuer) as batcher:
        for run_id in [*singly, unfinished.id, "run_unknown"]:
            await batcher.submit(run_id)
    for run in runs:
        stored = await store.get_receipt(run.id)
        assert stored is not None and stored.key_id == issuer.ring.kid
        batched = json.loads(stored.body)
        assert batched.pop("issuedAt") and singly[run.id].pop("issuedAt")
        assert batched == singly[run.id]
        assert batched["eventCount"] == len(await store.events(run.id))
    assert await store.get_receipt(unfinished.id) is None
