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
        app.mcp("x", command="python server.py")  # type: ignore[arg-type]
    with pytest.raises(lantern.UsageError, match="letters, digits"):
        app.mcp("a.b", command=["x"])
    with pytest.raises(lantern.UsageError, match="http:// or https://"):
        app.mcp("x", url="file:///etc/passwd")
    app.mcp("x", command=["x"])
    with pytest.raises(lantern.UsageError, match="registered twice"):
        app.mcp("x", url="http://127.0.0.1:1/mcp")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProvider]:
    provider = FakeProvider().start()
    for name, value in provider.env().items():
        monkeypatch.setenv(name, value)
    yield provider
    provider.close()


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
