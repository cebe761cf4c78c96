"""The two starts that are not a replica's claim keep flow control (docs/flow-control.md), on
both backends: ``lantern run --wait`` with no server (the CLI executes the run in its own
process) and a parked code-first run adopted by a replica that has its version. Each waits
while another run holds its concurrency key's slot, and starts once that run finishes.

``lantern run --wait`` is tested for graph, plain and code-first agents. Not for microVM ones:
the CLI's worker has no sandbox driver, so it hands a microVM run back queued for a server's
runtime scheduler (tests/runtime/test_microvm_runs.py tests that one's concurrency key)."""

from __future__ import annotations

import asyncio
import json
import runpy
from pathlib import Path

import pytest

import lantern
from lantern.engine.runs import create_run
from lantern.engine.worker import Worker
from lantern.store import Append, RunUpdate, Store
from tests.conformance.helpers import ev
from tests.fake_llm import FakeProvider, Script
from tests.integration.test_cli import LANTERN, Cli

KEY = {"key": "{{ input.customer }}", "limit": 1}
GRAPH = {"nodes": [{"id": "start", "type": "trigger"}], "edges": []}
KINDS = ("graph", "plain", "code")
# The code-first agent, as a module the CLI loads with --app (and this test, to hold its slot).
CODE_APP = f"""
import lantern

app = lantern.App()


@app.agent("per-customer", version="v1", concurrency={KEY!r})
async def run(ctx: lantern.Context, customer: str) -> str:
    return str(await ctx.step("greet", lambda: "hi " + customer))
"""


async def hold_slot(store: Store, agent: str, app: lantern.App | None = None) -> str:
    """A run of acme claimed by another replica: it holds acme's slot until ``release``."""
    holder = await create_run(store, agent, {"customer": "acme"}, app=app)
    leases = await store.claim_runs("replica", 60, 10, ("queued",))
    assert [lease.run_id for lease in leases] == [holder.id]
    return holder.id


async def release(store: Store, run_id: str) -> None:
    lease = await store.acquire_lease(run_id, "replica", 60)
    assert lease is not None
    await store.append(Append(lease, (ev(1, "run_started"),), RunUpdate("running")))
    await store.append(Append(lease, (ev(2, "run_ended"),), RunUpdate("succeeded")))


@pytest.mark.parametrize("kind", KINDS)
async def test_lantern_run_wait_without_a_server_waits_for_its_keys_slot(
    store: Store, database_url: str, tmp_path: Path, kind: str
) -> None:
    name, app, flags = "per-customer", None, tuple[str, ...]()
    if kind == "code":
        (tmp_path / "per_customer.py").write_text(CODE_APP)
        app = runpy.run_path(str(tmp_path / "per_customer.py"))["app"]
        flags = ("--app", "per_customer:app")
    else:
        body = {"graph": GRAPH} if kind == "graph" else {"model": "gpt-4o-mini", "maxTokens": 30}
        await store.put_agent("default", name, {"name": name, "concurrency": KEY, **body})
    holder = await hold_slot(store, name, app)
    cli = Cli(database_url, tmp_path)
    fake = FakeProvider(script=Script(["Hi."])).start()  # the plain agent's model
    proc = await asyncio.create_subprocess_exec(
        str(LANTERN),
        *("run", name, "--wait", "--input", json.dumps({"customer": "acme"}), *flags),
        env={**cli.env, **fake.env()},
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        said = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
        assert "waits for a free slot of its concurrency key 'acme'" in said, said
        await asyncio.sleep(0.5)  # a few of its looks for a slot
        mine = [r for r in await store.list_runs("default") if r.id != holder]
        assert [r.status for r in mine] == ["queued"] and await store.events(mine[0].id) == []
        await release(store, holder)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        fake.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, (out, err)
    assert json.loads(out)["status"] == "succeeded"
    assert json.loads(out)["id"] == mine[0].id
    assert len(fake.calls()) == (1 if kind == "plain" else 0)


def versioned(version: str) -> lantern.App:
    app = lantern.App()

    @app.agent("versioned", version=version, concurrency=KEY)
    async def run(ctx: lantern.Context, customer: str) -> str:
        return str(await ctx.step("which", lambda: version))

    return app


async def test_an_adopted_parked_run_waits_for_its_keys_slot(store: Store) -> None:
    v1, v2 = versioned("v1"), versioned("v2")
    parked = await create_run(store, "versioned", {"customer": "acme"}, app=v1)
    # A replica with v2 claims it and leaves it, parked, for one with v1.
    [lease] = await store.claim_runs("new", 60, 10, ("queued",))
    async with Worker(store, v2, worker_id="new", lease_ttl=60) as w:
        assert w.runner is not None
        await w.runner.drive(parked.id, lease)
    assert (await store.get_run(parked.id)).waiting_for == "v1"  # type: ignore[union-attr]
    holder = await hold_slot(store, "versioned")
    async with Worker(store, v1, worker_id="old", lease_ttl=60, recovery_interval=0.1) as w:
        serving = asyncio.create_task(w.serve())
        try:
            await asyncio.sleep(1.0)  # ten of its passes for runs to adopt
            still = await store.get_run(parked.id)
            assert still is not None and still.status == "waiting", still
            await release(store, holder)
            for _ in range(200):
                done = await store.get_run(parked.id)
                if done is not None and done.finished:
                    break
                await asyncio.sleep(0.05)
        finally:
            await w.stop()
            await serving
    assert done is not None and (done.status, done.output) == ("succeeded", "v1")
