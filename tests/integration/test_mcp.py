"""MCP servers' tools as Lantern tools, against a real MCP server written with the mcp SDK
(tests/mcp/notes_server.py) over stdio and streamable HTTP, driven in-process."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import lantern
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.ids import idempotency_key
from lantern.integrations.mcp import KEY_META
from lantern.store import Store
from tests.fake_llm import FakeProvider, Script
from tests.server import ROOT, free_port

SERVER = [sys.executable, "-m", "tests.mcp.notes_server"]


def calls(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def notes_app(log: Path, **where: Any) -> lantern.App:
    app = lantern.App()
    if not where:
        where = {"command": SERVER, "cwd": str(ROOT)}
    app.mcp("notes", env={"NOTES_LOG": str(log), "PYTHONPATH": str(ROOT)}, **where)
    return app


def graph(name: str, *steps: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"}]
    edges = []
    previous = "start"
    for step, tool, args in steps:
        nodes.append({"id": step, "type": "tool", "data": {"tool": tool, "args": args}})
        edges.append({"source": previous, "target": step})
        previous = step
    return {"name": name, "graph": {"nodes": nodes, "edges": edges}}


async def drive(store: Store, app: lantern.App, definition: dict[str, Any], input: Any) -> Any:
    await apply_agent(store, definition)
    run = await create_run(store, definition["name"], input)
    async with Worker(store, app, worker_id="w1", lease_ttl=60) as w:
        assert w.runner is not None
        return await w.runner.drive(run.id)


async def test_graph_tool_nodes_call_an_mcp_servers_tools_with_the_steps_key(
    store: Store, tmp_path: Path
) -> None:
    log = tmp_path / "notes.jsonl"
    app = notes_app(log)
    try:
        definition = graph(
            "notes-graph",
            ("add", "notes.add", {"text": "{{ input.text }}"}),
            ("find", "notes.search", {"query": "milk"}),
        )
        run = await drive(store, app, definition, {"text": "buy milk"})
        assert run.status == "succeeded", run.error
        assert run.output == {"result": ["buy milk"]}
        made = calls(log)
        assert [(c["tool"], c["args"]) for c in made] == [
            ("add", {"text": "buy milk"}),
            ("search", {"query": "milk", "limit": 5}),
        ]
        assert [c["meta"][KEY_META] for c in made] == [
            idempotency_key(run.id, "add", 1),
            idempotency_key(run.id, "find", 1),
        ]
        # The server's own schema and description, under the server's name.
        tool = app.tools["notes.search"]
        assert tool.description == "Notes containing the query, newest first."
        assert tool.schema is not None and tool.schema["required"] == ["query"]
        # Started once for both steps; a second run reuses the same server process.
        again = await drive(store, app, definition, {"text": "oat milk"})
        assert again.output == {"result": ["oat milk", "buy milk"]}
        assert len({c["pid"] for c in calls(log)}) == 1
        assert app.mcp_servers["notes"].starts == 1
    finally:
        await app.aclose()


async def test_a_server_that_died_between_calls_is_started_again(
    store: Store, tmp_path: Path
) -> None:
    log = tmp_path / "notes.jsonl"
    app = notes_app(log)
    definition = graph("one-note", ("add", "notes.add", {"text": "{{ input.text }}"}))
    try:
        first = await drive(store, app, definition, {"text": "a"})
        assert first.status == "succeeded", first.error
        (pid,) = {c["pid"] for c in calls(log)}
        os.kill(pid, signal.SIGKILL)  # the server dies while nobody is calling it
        await asyncio.sleep(0.2)
        second = await drive(store, app, definition, {"text": "b"})
        assert second.status == "succeeded", second.error
        assert second.output == {"count": 1, "text": "b"}  # a new process: a fresh store
        pids = [c["pid"] for c in calls(log)]
        assert len(pids) == 2 and pids[0] != pids[1]
        assert app.mcp_servers["notes"].starts == 2
    finally:
        await app.aclose()


async def test_a_server_that_is_down_fails_the_step_with_class_tool_retryable(
    store: Store, tmp_path: Path
) -> None:
    app = lantern.App()
    app.mcp("gone", command=[str(tmp_path / "no-such-server")])
    definition = graph("down", ("add", "gone.add", {"text": "x"}))
    run = await drive(store, app, definition, {})
    assert run.status == "failed"
    failed = [e for e in await store.events(run.id) if e.kind == "step_failed"]
    (error,) = [e.data["error"] for e in failed]
    assert (error["class"], error["retryable"]) == ("tool", True), error
    assert "MCP server 'gone'" in error["message"] and "is down" in error["message"]


def test_bad_registrations_are_refused_clearly() -> None:
    app = lantern.App()
    with pytest.raises(lantern.UsageError, match=re.escape("command=[...] (stdio) or url")):
        app.mcp("x")
    with pytest.raises(lantern.UsageError, match="command is a list"):
        app.mcp("x", command="python server.py")  # a str is a Sequence[str] to mypy
    with pytest.raises(lantern.UsageError, match="letters, digits"):
        app.mcp("a.b", command=["x"])
    with pytest.raises(lantern.UsageError, match="http:// or https://"):
        app.mcp("x", url="file:///etc/passwd")
    app.mcp("x", command=["x"])
    with pytest.raises(lantern.UsageError, match="registered twice"):
        app.mcp("x", url="http://127.0.0.1:1/mcp")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_plain_agent_gets_every_tool_of_a_server_with_star(
    store: Store, tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script = Script([[("notes_add", {"text": "call Ada"})], "Noted."])
    log = tmp_path / "notes.jsonl"
    app = notes_app(log)
    agent = {"name": "helper", "model": "gpt-4o-mini", "tools": ["notes.*"]}
    try:
        run = await drive(store, app, agent, "Remember to call Ada")
    finally:
        await app.aclose()
    assert run.status == "succeeded", run.error
    assert run.output["text"] == "Noted."
    first = fake.calls()[0].body
    offered = {t["function"]["name"]: t["function"] for t in first["tools"]}
    assert set(offered) == {"notes_add", "notes_search", "notes_crash"}
    assert offered["notes_search"]["description"] == "Notes containing the query, newest first."
    assert offered["notes_search"]["parameters"]["required"] == ["query"]
    (made,) = calls(log)
    assert made["args"] == {"text": "call Ada"}
    tool_steps = [
        e
        for e in await store.events(run.id)
        if e.kind == "step_completed" and (e.step_id or "").startswith("tool:")
    ]
    (step,) = tool_steps
    assert step.data["output"] == {"count": 1, "text": "call Ada"}
    assert made["meta"][KEY_META] == idempotency_key(run.id, step.step_id or "", 1)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    log = tmp_path / "http-notes.jsonl"
    port = free_port()
    env = {**os.environ, "NOTES_LOG": str(log), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [*SERVER, "--http", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield url, log
    proc.terminate()
    proc.wait(10)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_streamable_http_server_works_the_same(
    store: Store, http_server: tuple[str, Path]
) -> None:
    url, log = http_server
    app = lantern.App()
    app.mcp("web", url=url)
    try:
        run = await drive(store, app, graph("web", ("add", "web.add", {"text": "hi"})), {})
    finally:
        await app.aclose()
    assert run.status == "succeeded", run.error
    assert run.output == {"count": 1, "text": "hi"}
    (made,) = calls(log)
    assert made["meta"][KEY_META] == idempotency_key(run.id, "add", 1)


class Crash(BaseException):
    """Stands for a SIGKILL: nothing in the engine catches it, nothing is cleaned up."""


async def test_ctx_tool_calls_an_mcp_tool_as_a_step_with_its_key_replayed_after_a_crash(
    store: Store, tmp_path: Path
) -> None:
    log = tmp_path / "notes.jsonl"
    app = notes_app(log)
    crash = {"on": True}

    def crash_once() -> str:
        if crash["on"]:
            crash["on"] = False
            raise Crash()
        return "on"

    @app.agent("jot")
    async def jot(ctx: lantern.Context, text: str) -> Any:
        added = await ctx.tool("notes.add", text=text)
        await ctx.step("between", crash_once)
        found = await ctx.tool("notes.search", query=text)
        return {"added": added, "found": found}

    run = await create_run(store, "jot", {"text": "tea"}, app=app)
    try:
        async with Worker(store, app, worker_id="w1", lease_ttl=60) as w:
            assert w.runner is not None
            with pytest.raises(Crash):
                await w.runner.drive(run.id)
        async with Worker(store, app, worker_id="w1", lease_ttl=60) as w:
            assert w.runner is not None
            done = await w.runner.drive(run.id)
    finally:
        await app.aclose()
    assert done is not None
    assert done.status == "succeeded", done.error
    # notes.add ran once, before the crash; the replay served its output from the journal.
    assert done.output == {"added": {"count": 1, "text": "tea"}, "found": {"result": ["tea"]}}
    made = calls(log)
    assert [c["tool"] for c in made] == ["add", "search"]
    assert [c["meta"][KEY_META] for c in made] == [
        idempotency_key(run.id, "notes.add", 1),
        idempotency_key(run.id, "notes.search", 1),
    ]
    completed = [e.step_id for e in await store.events(run.id) if e.kind == "step_completed"]
    assert completed == ["notes.add", "between", "notes.search"]


async def test_ctx_tool_with_its_server_down_fails_the_step_class_tool_retryable(
    store: Store, tmp_path: Path
) -> None:
    app = lantern.App()
    app.mcp("gone", command=[str(tmp_path / "no-such-server")])

    @app.agent("down-code")
    async def down_code(ctx: lantern.Context) -> Any:
        return await ctx.tool("gone.add", text="x")

    run = await create_run(store, "down-code", None, app=app)
    async with Worker(store, app, worker_id="w1", lease_ttl=60) as w:
        assert w.runner is not None
        done = await w.runner.drive(run.id)
    assert done is not None
    assert done.status == "failed"
    failed = [e for e in await store.events(run.id) if e.kind == "step_failed"]
    assert [e.step_id for e in failed] == ["gone.add"]
    error = failed[0].data["error"]
    assert (error["class"], error["retryable"]) == ("tool", True), error
    assert "MCP server 'gone'" in error["message"] and "is down" in error["message"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_plain_agents_tool_whose_server_dies_fails_the_step_and_is_retried(
    store: Store, tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script = Script([[("notes_crash", {})], "never reached"])
    log = tmp_path / "notes.jsonl"
    app = notes_app(log)
    agent = {
        "name": "crasher",
        "model": "gpt-4o-mini",
        "tools": ["notes.*"],
        "retry": {"maxAttempts": 2, "backoffMs": 0},
    }
    try:
        run = await drive(store, app, agent, "Crash the server")
    finally:
        await app.aclose()
    assert run.status == "failed"
    events = await store.events(run.id)
    # Attempt 1 failed into a retry, attempt 2 failed the step (and so the run).
    ended = [e for e in events if e.kind in ("step_retrying", "step_failed")]
    assert [(e.kind, e.attempt) for e in ended] == [("step_retrying", 2), ("step_failed", 2)]
    step = ended[0].step_id or ""
    assert step.startswith("tool:") and ended[1].step_id == step
    for e in ended:
        error = e.data["error"]
        assert (error["class"], error["retryable"]) == ("tool", True), error
        assert "MCP server 'notes'" in error["message"], error
    # The model was never handed the failure as a tool result: one model turn only.
    assert len(fake.calls()) == 1
    made = calls(log)
    assert [c["tool"] for c in made] == ["crash", "crash"]
    assert [c["meta"][KEY_META] for c in made] == [
        idempotency_key(run.id, step, 1),
        idempotency_key(run.id, step, 2),
    ]
    assert made[0]["pid"] != made[1]["pid"]  # the dead server was started again


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_ctx_model_offers_an_mcp_tool_and_its_replay_starts_no_server(
    store: Store, tmp_path: Path, fake: FakeProvider
) -> None:
    fake.script = Script(["Noted."])
    log = tmp_path / "notes.jsonl"
    crash = {"on": True}

    def crash_once() -> str:
        if crash["on"]:
            crash["on"] = False
            raise Crash()
        return "on"

    def make_app() -> lantern.App:
        app = notes_app(log)

        @app.agent("asks-notes")
        async def asks_notes(ctx: lantern.Context) -> str:
            reply = await ctx.model("gpt-4o-mini", prompt="Note: tea", tools=["notes.add"])
            await ctx.step("between", crash_once)
            return reply.text

        return app

    first = make_app()  # a fresh process: the server is not started until the step runs
    run = await create_run(store, "asks-notes", None, app=first)
    try:
        async with Worker(store, first, worker_id="w1", lease_ttl=60) as w:
            assert w.runner is not None
            with pytest.raises(Crash):
                await w.runner.drive(run.id)
    finally:
        await first.aclose()
    second = make_app()  # the restarted process
    try:
        async with Worker(store, second, worker_id="w1", lease_ttl=60) as w:
            assert w.runner is not None
            done = await w.runner.drive(run.id)
    finally:
        await second.aclose()
    assert done is not None
    assert done.status == "succeeded", done.error
    assert done.output == "Noted."
    (sent,) = fake.calls()  # the model step was replayed, not sent again
    (offered,) = [t["function"] for t in sent.body["tools"]]
    assert offered["name"] == "notes_add"
    assert offered["description"] == "Add a note; answers how many notes there are."
    assert first.mcp_servers["notes"].starts == 1
    assert second.mcp_servers["notes"].starts == 0  # the replay needed no server
