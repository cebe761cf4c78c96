"""The receipts part of the store, and issuing over it, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import lantern
from lantern.config import Settings
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.errors import Conflict
from lantern.receipts.batch import ReceiptBatcher
from lantern.receipts.export import local_export
from lantern.receipts.issue import Issuer, SignedReceipt, open_issuer
from lantern.receipts.keys import KeyRing, parse_pem, private_pem
from lantern.receipts.verify import verify
from lantern.store import Run, Store
from lantern.store.records import StoredReceipt

AGENT = {
    "name": "pair",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "a", "type": "tool", "data": {"tool": "echo", "args": {"x": "{{ input.x }}"}}},
            {
                "id": "b",
                "type": "tool",
                "data": {"tool": "echo", "args": {"a": "{{ steps.a.output }}"}},
            },
        ],
        "edges": [{"source": "start", "target": "a"}, {"source": "a", "target": "b"}],
    },
}


def tools(calls: list[str]) -> lantern.App:
    app = lantern.App()

    @app.tool("echo")
    async def echo(ctx: lantern.ToolContext, **kwargs: Any) -> dict[str, Any]:
        calls.append(ctx.step_id)
        return dict(kwargs)

    return app


def ring() -> KeyRing:
    return parse_pem(private_pem(Ed25519PrivateKey.generate()), "test")


async def finished_run(store: Store, issuer: Issuer | None, calls: list[str]) -> Run:
    await apply_agent(store, AGENT)
    created = await create_run(store, "pair", {"x": 1.5})
    hook = None if issuer is None else issuer.after_finish
    async with Worker(store, tools(calls), worker_id="w", lease_ttl=30, issue_receipt=hook) as w:
        assert w.runner is not None
        run = await w.runner.drive(created.id)
    assert run is not None and run.status == "succeeded", run
    return run


def jwks(*rings: KeyRing) -> list[dict[str, str]]:
    return [k.jwk() for r in rings for k in r.keys]


async def test_signing_keys_register_once_and_list_oldest_first(store: Store) -> None:
    await store.register_signing_key("k1", "x1")
    await asyncio.sleep(0.01)
    await store.register_signing_key("k2", "x2")
    await store.register_signing_key("k1", "other")  # known: nothing changes
    found = await store.signing_keys()
    assert [(k.kid, k.x) for k in found] == [("k1", "x1"), ("k2", "x2")]


async def test_the_first_receipt_stored_for_a_run_is_the_one_kept(store: Store) -> None:
    calls: list[str] = []
    run = await finished_run(store, None, calls)
    await store.register_signing_key("k1", "x1")
    assert await store.get_receipt(run.id) is None
    first = await store.put_receipt(StoredReceipt(run.id, "k1", '{"a":1}', "sig1"))
    second = await store.put_receipt(StoredReceipt(run.id, "k1", '{"a":2}', "sig2"))
    assert (first.body, first.signature) == (second.body, second.signature) == ('{"a":1}', "sig1")
    stored = await store.get_receipt(run.id)
    assert stored is not None and stored.body == '{"a":1}' and stored.created_at is not None


async def test_a_batch_of_receipts_keeps_any_stored_first(store: Store) -> None:
    runs = [await finished_run(store, None, []) for _ in range(3)]
    await store.register_signing_key("k1", "x1")
    kept = await store.put_receipt(StoredReceipt(runs[0].id, "k1", '{"a":0}', "sig0"))
    batch = [StoredReceipt(r.id, "k1", f'{{"b":{i}}}', f"b{i}") for i, r in enumerate(runs)]
    # Racing a read that issues the second run's receipt: either may be first, one is kept.
    _, raced = await asyncio.gather(
        store.put_receipts(batch), store.put_receipt(StoredReceipt(runs[1].id, "k1", "{}", "r"))
    )
    got = [await store.get_receipt(r.id) for r in runs]
    assert got[0] is not None and (got[0].body, got[0].signature) == (kept.body, kept.signature)
    assert got[1] is not None and (got[1].body, got[1].signature) == (raced.body, raced.signature)
    assert got[2] is not None and (got[2].body, got[2].signature) == ('{"b":2}', "b2")
    await store.put_receipts([])  # nothing to store: no transaction either


async def test_runs_finishing_together_get_one_valid_receipt_each(store: Store) -> None:
    """Graph runs here; plain-agent, code-first and microVM runs reach the same hook with their
    id (the runner's issue_receipt, the relay's finished), so the batch treats them alike."""
    issuer = Issuer(store, ring())
    await _register(store, issuer)
    await apply_agent(store, AGENT)
    created = [await create_run(store, "pair", {"x": i}) for i in range(12)]
    async with ReceiptBatcher(issuer) as batcher:
        hook = batcher.submit
        async with Worker(store, tools([]), worker_id="w", lease_ttl=30, issue_receipt=hook) as w:
            assert w.runner is not None
            runs = await asyncio.gather(*(w.runner.drive(c.id) for c in created))
        # Read as soon as the run is answered, perhaps while its receipt is pending.
        early = await issuer.receipt(runs[0]) if runs[0] is not None else None
    # Stopped cleanly: every pending receipt was issued, none is left to a read.
    for run in runs:
        assert run is not None and run.status == "succeeded"
        stored = await store.get_receipt(run.id)
        assert stored is not None, run.id
        assert verify(await local_export(store, issuer, run.id), jwks(issuer.ring)) == []
    first = await store.get_receipt(created[0].id)
    assert first is not None and SignedReceipt.of(first) == early


async def test_journal_head_is_the_count_and_the_last_hash(store: Store) -> None:
    run = await finished_run(store, None, [])
    events = await store.events(run.id)
    assert await store.journal_head(run.id) == (len(events), events[-1].hash)
    assert await store.journal_head("run_unknown") == (0, None)


async def test_the_runner_issues_a_receipt_that_verifies(store: Store, tmp_path: Path) -> None:
    issuer = await open_issuer(Settings(database_url=store.url, data_dir=str(tmp_path)), store)
    run = await finished_run(store, issuer, [])
    stored = await store.get_receipt(run.id)
    assert stored is not None, "the runner issues the receipt after the finishing commit"
    doc = await local_export(store, issuer, run.id)
    assert verify(doc, jwks(issuer.ring)) == []
    receipt = doc["receipt"]
    assert receipt["runId"] == run.id and receipt["status"] == "succeeded"
    assert receipt["eventCount"] == len(doc["events"])
    assert receipt["journalHead"] == "sha256:" + doc["events"][-1]["hash"]
    assert receipt["keyId"] == doc["keyId"] == issuer.ring.kid
    # The JSON a file round-trips through verifies as well.
    assert verify(json.loads(json.dumps(doc)), jwks(issuer.ring)) == []


async def test_a_redriven_finished_run_keeps_its_one_receipt(store: Store) -> None:
    calls: list[str] = []
    issuer = Issuer(store, ring())
    await _register(store, issuer)
    run = await finished_run(store, issuer, calls)
    first = await issuer.receipt(run)
    # A re-drive of the finished run invokes nothing and issues nothing new.
    async with Worker(store, tools(calls), worker_id="w2", lease_ttl=30) as w:
        assert w.runner is not None
        await w.runner.drive(run.id)
    assert calls == ["a", "b"]
    # A second replica with a key of its own, and a retry, get the same receipt back.
    other = Issuer(store, ring())
    await _register(store, other)
    again = await asyncio.gather(other.issue(run), issuer.issue(run), other.receipt(run))
    assert all(r == first for r in again)


async def test_concurrent_first_issues_agree_on_one_receipt(store: Store) -> None:
    run = await finished_run(store, None, [])
    issuers = [Issuer(store, ring()) for _ in range(4)]
    for issuer in issuers:
        await _register(store, issuer)
    got = await asyncio.gather(*(i.receipt(run) for i in issuers))
    assert len({r.signature for r in got}) == 1
    assert (
        verify(await local_export(store, issuers[0], run.id), jwks(*(i.ring for i in issuers)))
        == []
    )


async def test_an_unfinished_run_has_no_receipt(store: Store) -> None:
    await apply_agent(store, AGENT)
    queued = await create_run(store, "pair", {"x": 1})
    with pytest.raises(Conflict, match="has not finished"):
        await Issuer(store, ring()).receipt(queued)
    assert await store.get_receipt(queued.id) is None


async def _register(store: Store, issuer: Issuer) -> None:
    for key in issuer.ring.keys:
        await store.register_signing_key(key.kid, key.x)
