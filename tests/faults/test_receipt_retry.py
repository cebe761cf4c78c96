"""A receipt batch the database refuses is tried again until it is stored, with no read of
the run to issue it: the database itself refuses every receipt (a trigger, on both backends)
while graph and code-first runs finish, then accepts them again. Plain-agent and microVM runs
hand the batch the same run id once finished (the runner's and the relay's hook), so what
holds for these holds for them.

A batch still refused when the server stops is tried once more and left to its runs' first
read, as before; that stop does not wait out the database."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import lantern
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.receipts import batch
from lantern.receipts.batch import ReceiptBatcher
from lantern.receipts.issue import Issuer
from lantern.receipts.keys import parse_pem, private_pem
from lantern.store import Store

SQLITE_REFUSE = """
CREATE TRIGGER refuse_receipts BEFORE INSERT ON receipts
BEGIN SELECT RAISE(ABORT, 'receipts refused'); END
"""
POSTGRES_REFUSE = """
CREATE FUNCTION refuse_receipts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'receipts refused'; END $$;
CREATE TRIGGER refuse_receipts BEFORE INSERT ON receipts
    FOR EACH ROW EXECUTE FUNCTION refuse_receipts();
"""

GRAPH = {
    "name": "one",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "a", "type": "tool", "data": {"tool": "echo", "args": {"x": "{{ input.x }}"}}},
        ],
        "edges": [{"source": "start", "target": "a"}],
    },
}


def app() -> lantern.App:
    tools = lantern.App()

    @tools.tool("echo")
    async def echo(ctx: lantern.ToolContext, **kwargs: Any) -> dict[str, Any]:
        return dict(kwargs)

    @tools.agent("code")
    async def code(ctx: lantern.Context, x: int) -> int:
        return int(await ctx.step("double", lambda: 2 * x))

    return tools


def refuse(url: str, on: bool) -> None:
    """Make the database refuse (or accept again) every receipt, from outside the store."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute(SQLITE_REFUSE if on else "DROP TRIGGER refuse_receipts")
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(POSTGRES_REFUSE if on else "DROP TRIGGER refuse_receipts ON receipts")


async def finish_runs(store: Store, issuer: Issuer, hook: Any) -> list[str]:
    """A graph run and a code-first run driven to their end, each handing ``hook`` its id."""
    await apply_agent(store, GRAPH)
    tools = app()
    graph = await create_run(store, "one", {"x": 1})
    code = await create_run(store, "code", {"x": 2}, app=tools)
    async with Worker(store, tools, worker_id="w", lease_ttl=30, issue_receipt=hook) as w:
        assert w.runner is not None
        runs = [await w.runner.drive(graph.id), await w.runner.drive(code.id)]
    assert [r.status if r else None for r in runs] == ["succeeded", "succeeded"]
    return [graph.id, code.id]


async def test_a_refused_batch_is_stored_once_the_database_accepts_it(
    store: Store, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch, "RETRY_S", 0.05)
    issuer = Issuer(store, parse_pem(private_pem(Ed25519PrivateKey.generate()), "test"))
    await store.register_signing_key(issuer.ring.kid, issuer.ring.keys[0].x)
    refuse(database_url, True)
    async with ReceiptBatcher(issuer) as batcher:
        ids = await finish_runs(store, issuer, batcher.submit)
        await asyncio.sleep(0.5)  # several tries, each refused
        assert [await store.get_receipt(i) for i in ids] == [None, None]
        refuse(database_url, False)
        deadline = time.monotonic() + 10
        while any([await store.get_receipt(i) is None for i in ids]):
            assert time.monotonic() < deadline, "the refused receipts were never stored"
            await asyncio.sleep(0.05)
    for run_id in ids:  # each stored by the batch, signed over its run's whole journal
        stored = await store.get_receipt(run_id)
        assert stored is not None and stored.key_id == issuer.ring.kid
        assert f'"eventCount":{len(await store.events(run_id))}' in stored.body


async def test_a_stop_does_not_wait_for_a_database_that_still_refuses(
    store: Store, database_url: str
) -> None:
    issuer = Issuer(store, parse_pem(private_pem(Ed25519PrivateKey.generate()), "test"))
    await store.register_signing_key(issuer.ring.kid, issuer.ring.keys[0].x)
    refuse(database_url, True)
    batcher = ReceiptBatcher(issuer)
    async with batcher:
        ids = await finish_runs(store, issuer, batcher.submit)
        await asyncio.sleep(0.2)  # refused at least once: now pausing before a retry
        began = time.monotonic()
    assert time.monotonic() - began < 2  # the pause was cut short, the last try refused too
    refuse(database_url, False)
    assert [await store.get_receipt(i) for i in ids] == [None, None]
    # Left to the first read, which issues it.
    for run_id in ids:
        run = await store.get_run(run_id)
        assert run is not None and (await issuer.receipt(run)) is not None
        assert await store.get_receipt(run_id) is not None
