"""The runner in-process, on both backends: execution, replay gate, fencing, failures."""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from typing import Any

import pytest

import lantern
from lantern.demo.receiver import Receiver
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.store import Store
from tests.helpers import http_chain


def make_app(calls: Counter[str]) -> lantern.App:
    app = lantern.App()

    @app.tool("echo")
    async def echo(ctx: lantern.ToolContext, **kwargs: Any) -> dict[str, Any]:
        calls[ctx.step_id] += 1
        return {"args": kwargs, "key": ctx.idempotency_key}

    @app.tool("boom")
    def boom() -> None:
        raise RuntimeError("the tool broke")

    @app.tool("not_json")
    async def not_json() -> object:
        return object()

    return app


def graph(name: str, nodes: list[dict[str, Any]], edges: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "name": name,
        "graph": {
            "nodes": [{"id": "start", "type": "trigger"}, *nodes],
            "edges": [{"source": s, "target": t} for s, t in edges],
        },
    }


def tool(node_id: str, name: str = "echo", **args: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "tool", "data": {"tool": name, "args": args}}


DIAMOND = graph(
    "diamond",
    [
        tool("left", x="{{ input.x }}"),
        tool("right", y="{{ input.x * 2 }}"),
        tool("join", l="{{ steps.left.output.args.x }}", r="{{ steps.right.output.args.y }}"),
    ],
    [("start", "left"), ("start", "right"), ("left", "join"), ("right", "join")],
)


async def run_agent(store: Store, app: lantern.App, definition: dict[str, Any], input: Any) -> Any:
    await apply_agent(store, definition)
    run = await create_run(store, definition["name"], input)
    async with Worker(store, app, worker_id="w1", lease_ttl=60) as w:
        assert w.runner is not None
        return await w.runner.drive(run.id)


async def test_a_diamond_runs_each_step_once_and_joins(store: Store) -> None:
    calls: Counter[str] = Counter()
    run = await run_agent(store, make_app(calls), DIAMOND, {"x": 3})
    assert run.status == "succeeded"
    assert run.output["args"] == {"l": 3, "r": 6}
    assert calls == {"left": 1, "right": 1, "join": 1}
    events = await store.events(run.id)
    completed = [e.step_id for e in events if e.kind == "step_completed"]
    assert None not in completed  # a step event names its step
    assert sorted(s for s in completed if s is not None) == ["join", "left", "right", "start"]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[-1].kind == "run_succeeded"
    # Every step was journaled as started before it completed.
    for step in completed:
        kinds = [e.kind for e in events if e.step_id == step]
        assert kinds == ["step_started", "step_completed"]


async def test_redriving_a_finished_run_invokes_nothing_and_writes_nothing(store: Store) -> None:
    calls: Counter[str] = Counter()
    app = make_app(calls)
    run = await run_agent(store, app, DIAMOND, {"x": 1})
    before = await store.events(run.id)
    async with Worker(store, app, worker_id="w2", lease_ttl=60) as w:
        assert w.runner is not None
        again = await w.runner.drive(run.id)
    assert again is not None and again.status == "succeeded"
    assert calls == {"left": 1, "right": 1, "join": 1}
    assert await store.events(run.id) == before


async def test_http_steps_carry_the_idempotency_key(store: Store, receiver: Receiver) -> None:
    run = await run_agent(store, lantern.App(), http_chain("chain", receiver.url, 3), {"a": 1})
    assert run.status == "succeeded"
    for k in (1, 2, 3):
        want = hashlib.sha256(f"{run.id}|s{k}|1".encode()).hexdigest()
        assert receiver.keys(f"/s{k}") == {want}
        assert receiver.count(f"/s{k}") == 1
    assert receiver.hits[2].body["previous"] == {"path": "/s2", "received": 1}
    assert run.output == {"status": 200, "body": {"path": "/s3", "received": 1}}


async def test_a_non_2xx_answer_fails_the_step(store: Store) -> None:
    definition = graph(
        "bad-http",
        [
            {
                "id": "post",
                "type": "connector",
                "data": {"connector": "http", "url": "http://127.0.0.1:9/nothing-listens"},
            }
        ],
        [("start", "post")],
    )
    run = await run_agent(store, lantern.App(), definition, {})
    assert run.status == "failed"
    assert run.error["step"] == "post" and run.error["class"] == "connector"


@pytest.mark.parametrize(
    ("node", "message"),
    [
        (tool("t", "boom"), "tool 'boom' failed: RuntimeError: the tool broke"),
        (tool("t", "missing"), "tool 'missing' is not registered"),
        (tool("t", "not_json"), "not JSON"),
        (tool("t", x="{{ input.nowhere.deeper }}"), "template error in t.args.x"),
    ],
)
async def test_a_failed_step_fails_the_run_with_a_clear_error(
    store: Store, node: dict[str, Any], message: str
) -> None:
    definition = graph("failing", [node, tool("after")], [("start", "t"), ("t", "after")])
    calls: Counter[str] = Counter()
    run = await run_agent(store, make_app(calls), definition, {})
    assert run.status == "failed"
    assert message in run.error["message"]
    assert "after" not in calls
    kinds = [e.kind for e in await store.events(run.id)]
    assert kinds[-2:] == ["step_failed", "run_failed"]


async def test_a_run_keeps_the_version_it_started_with(store: Store) -> None:
    calls: Counter[str] = Counter()
    app = make_app(calls)
    await apply_agent(store, graph("pinned", [tool("v1")], [("start", "v1")]))
    run = await create_run(store, "pinned", {})
    await apply_agent(store, graph("pinned", [tool("v2")], [("start", "v2")]))
    async with Worker(store, app, worker_id="w1", lease_ttl=60) as w:
        assert w.runner is not None
        done = await w.runner.drive(run.id)
    assert done is not None and done.status == "succeeded" and done.agent_version == 1
    assert calls == {"v1": 1}


async def test_a_writer_whose_lease_was_taken_stops_at_its_next_write(store: Store) -> None:
    entered, leave = asyncio.Event(), asyncio.Event()
    calls: Counter[str] = Counter()
    app = lantern.App()

    @app.tool("slow")
    async def slow(ctx: lantern.ToolContext) -> int:
        calls[ctx.step_id] += 1
        entered.set()
        await leave.wait()
        return 1

    await apply_agent(
        store, graph("fenced", [tool("a", "slow"), tool("b", "slow")], [("start", "a"), ("a", "b")])
    )
    run = await create_run(store, "fenced", {})
    async with Worker(store, app, worker_id="w1", lease_ttl=60) as w:
        assert w.runner is not None
        driving = asyncio.create_task(w.runner.drive(run.id))
        await entered.wait()
        # Another incarnation of the same worker id takes the run back: a new epoch.
        thief = await store.acquire_lease(run.id, "w1", ttl=60)
        assert thief is not None and thief.epoch == 2
        leave.set()
        assert await driving is None
    events = await store.events(run.id)
    assert not [e for e in events if e.kind == "step_completed" and e.step_id == "a"]
    assert calls == {"a": 1}
    stored = await store.get_run(run.id)
    assert stored is not None and stored.status == "running"


async def test_worker_serves_queued_runs_and_stops_cleanly(store: Store) -> None:
    calls: Counter[str] = Counter()
    app = make_app(calls)
    await apply_agent(store, DIAMOND)
    runs = [await create_run(store, "diamond", {"x": i}) for i in range(5)]
    async with Worker(store, app, worker_id="w1", lease_ttl=60, poll_interval=0.05) as w:
        serving = asyncio.create_task(w.serve())
        for _ in range(200):
            done = [await store.get_run(r.id) for r in runs]
            if all(d is not None and d.status == "succeeded" for d in done):
                break
            await asyncio.sleep(0.05)
        await w.stop()
        await serving
    assert calls == {"left": 5, "right": 5, "join": 5}
    assert await store.claim_runs("w2", 60, 10, ("queued", "running")) == []


async def test_a_long_step_keeps_its_lease_renewed(store: Store) -> None:
    app = lantern.App()

    @app.tool("long")
    async def long() -> str:
        await asyncio.sleep(1.0)  # over three lease TTLs
        return "done"

    await apply_agent(store, graph("long", [tool("l", "long")], [("start", "l")]))
    run = await create_run(store, "long", {})
    async with Worker(store, app, worker_id="w1", lease_ttl=0.3) as w:
        assert w.runner is not None
        driving = asyncio.create_task(w.runner.drive(run.id))
        for _ in range(8):
            await asyncio.sleep(0.1)
            assert await store.acquire_lease(run.id, "thief", ttl=60) is None
        done = await driving
    assert done is not None and done.status == "succeeded"


async def test_a_run_that_keeps_crashing_fails_with_recovery_exhausted(store: Store) -> None:
    class Crash(BaseException):
        pass

    app = lantern.App()

    @app.tool("poison")
    async def poison() -> None:
        raise Crash  # like a step that takes its process down every time

    await apply_agent(store, graph("poison", [tool("p", "poison")], [("start", "p")]))
    run = await create_run(store, "poison", {})
    for _ in range(3):  # the first drive and two recoveries crash
        async with Worker(store, app, worker_id="w1", lease_ttl=60, max_recoveries=2) as w:
            assert w.runner is not None
            with pytest.raises(Crash):
                await w.runner.drive(run.id)
    async with Worker(store, app, worker_id="w1", lease_ttl=60, max_recoveries=2) as w:
        assert w.runner is not None
        done = await w.runner.drive(run.id)
    assert done is not None and done.status == "failed"
    assert done.error["code"] == "recovery_exhausted" and done.error["recoveries"] == 2
    kinds = [e.kind for e in await store.events(run.id)]
    assert kinds.count("run_recovered") == 2 and kinds[-1] == "run_failed"


async def test_the_journal_is_hash_chained_and_tampering_is_named(
    store: Store, database_url: str
) -> None:
    import subprocess
    import sys
    from pathlib import Path

    from lantern.engine.chain import first_broken

    run = await run_agent(store, make_app(Counter()), DIAMOND, {"x": 2})
    events = await store.events(run.id)
    assert all(e.hash for e in events) and first_broken(events) is None
    lantern_cli = str(Path(sys.executable).parent / "lantern")
    env = {"LANTERN_DATABASE_URL": database_url, "PATH": "/usr/bin:/bin"}

    def verify() -> subprocess.CompletedProcess[str]:
        args = [lantern_cli, "journal", "verify", run.id]
        return subprocess.run(args, env=env, capture_output=True, text=True)

    ok = await asyncio.to_thread(verify)
    assert ok.returncode == 0 and f"{len(events)} events" in ok.stdout, ok.stderr
    # Change one stored event behind the engine's back.
    if database_url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(database_url.removeprefix("sqlite:///"))
        conn.execute(
            'UPDATE journal_events SET data = \'{"type":"forged"}\' WHERE run_id = ? AND seq = 4',
            (run.id,),
        )
        conn.commit()
        conn.close()
    else:
        import psycopg

        with psycopg.connect(database_url, autocommit=True) as pg:
            pg.execute(
                'UPDATE journal_events SET data = \'{"type":"forged"}\''
                " WHERE run_id = %s AND seq = 4",
                (run.id,),
            )
    bad = await asyncio.to_thread(verify)
    assert bad.returncode == 1 and "at event 4" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


async def test_an_output_canonical_json_cannot_hold_fails_the_step(store: Store) -> None:
    app = lantern.App()

    @app.tool("huge")
    async def huge() -> dict[str, int]:
        return {"n": 2**60 + 1}  # no double holds it

    definition = graph("huge", [tool("h", "huge"), tool("after")], [("start", "h"), ("h", "after")])
    run = await run_agent(store, app, definition, {})
    assert run.status == "failed" and "journal cannot store" in run.error["message"]
    assert run.error["step"] == "h"
    events = await store.events(run.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    from lantern.engine.chain import first_broken

    assert first_broken(events) is None
