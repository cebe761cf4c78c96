"""A tool (or a code-first agent) registered for some workspaces is not there for the others:
their agents cannot name it, their runs cannot call it, and nothing tells them it exists.
Every tool learns the run's workspace from its ToolContext (a real `lantern serve` with the
app loaded)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lantern import App, UsageError
from tests.hostile.kit import Tenant
from tests.server import Server

SCOPES = "runs:execute,runs:read,agents:write,agents:read"


def graph(name: str, tool: str) -> dict[str, Any]:
    return {
        "name": name,
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "t", "type": "tool", "data": {"tool": tool, "args": {"account": "A-1"}}},
            ],
            "edges": [{"source": "start", "target": "t"}],
        },
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp("tool-workspaces")
    s = Server(
        f"sqlite:///{tmp / 'lantern.db'}",
        tmp / "serve.log",
        app="tests.hostile.tenant_tools_app:app",
    ).start()
    yield s
    s.stop()


@pytest.fixture
def tenants(server: Server) -> Iterator[tuple[Tenant, Tenant]]:
    acme, globex = Tenant(server, "acme", SCOPES), Tenant(server, "globex", SCOPES)
    yield acme, globex
    acme.close()
    globex.close()


def test_the_workspace_a_tool_serves_calls_it_and_the_tool_knows_the_workspace(
    tenants: tuple[Tenant, Tenant],
) -> None:
    acme, _ = tenants
    assert acme.apply(graph("books-graph", "ledger")).status_code in (200, 201)
    run = acme.finished(acme.start("books-graph"))
    assert run["status"] == "succeeded", run
    assert run["output"] == {"account": "A-1", "workspace": "acme"}


def test_another_workspace_cannot_name_it_in_a_graph_or_a_plain_agent(
    tenants: tuple[Tenant, Tenant],
) -> None:
    _, globex = tenants
    for definition in (
        graph("books-graph", "ledger"),
        {"name": "clerk", "model": "offline", "prompt": "hi", "tools": ["ledger"]},
    ):
        answer = globex.apply(definition)
        assert answer.status_code == 422, answer.text
        assert "tool 'ledger' is not registered by the app" in answer.text
        assert "acme" not in answer.text  # nor who has it
    assert globex.http.get("/v1/agents/books-graph").status_code == 404  # nothing stored


def test_another_workspace_cannot_call_it_from_code(tenants: tuple[Tenant, Tenant]) -> None:
    acme, globex = tenants
    mine = acme.finished(acme.start("books", {"account": "A-2"}))
    assert mine["output"] == {"account": "A-2", "workspace": "acme"}
    theirs = globex.finished(globex.start("books", {"account": "A-2"}))
    assert theirs["status"] == "failed"
    assert "ctx.tool('ledger'): no such tool is registered" in theirs["error"]["message"]
    calls = [e for e in globex.events(theirs["id"]) if e["kind"] == "step_started"]
    assert calls == []  # refused before any step ran


def test_an_unrestricted_tool_is_everyones_and_tells_each_its_workspace(
    tenants: tuple[Tenant, Tenant],
) -> None:
    for tenant in tenants:
        definition = graph("who", "whoami")
        definition["graph"]["nodes"][1]["data"].pop("args")
        assert tenant.apply(definition).status_code in (200, 201)
        run = tenant.finished(tenant.start("who"))
        assert run["output"] == tenant.workspace


def test_workspaces_must_be_a_list_of_names() -> None:
    with pytest.raises(UsageError, match="a list of workspace names"):
        App().tool("t", workspaces="acme")(lambda: None)


def test_an_mcp_server_for_some_workspaces_hides_all_its_tools_from_the_rest() -> None:
    app = App()
    app.mcp("notes", command=["true"], workspaces=["acme"])  # never started: names only
    assert app.tools_for("acme").has("notes.add")
    assert not app.tools_for("globex").has("notes.add")


def test_every_lookup_of_another_workspaces_tool_finds_nothing() -> None:
    app = App()
    app.tool("ledger", workspaces=["acme"])(lambda: None)
    app.mcp("notes", command=["false"], workspaces=["acme"])  # started, it would fail
    theirs, mine = app.tools_for("globex"), app.tools_for("acme")
    assert mine.has("ledger") and mine.registered("ledger") is not None
    assert not theirs.has("ledger") and theirs.registered("ledger") is None
    assert asyncio.run(theirs.find("ledger")) is None
    assert asyncio.run(theirs.find("notes.add")) is None  # not even started
    assert asyncio.run(theirs.resolve(["ledger", "notes.*", "notes.add"])) == []


def test_a_code_agent_for_some_workspaces_is_not_there_for_the_rest(
    tenants: tuple[Tenant, Tenant],
) -> None:
    """As a tool: another workspace cannot run it, schedule it, read it or see it listed.
    (A microVM agent's entrypoint is refused in its VM: tests/runtime/test_microvm_runs.py.)"""
    acme, globex = tenants
    assert acme.finished(acme.start("acme-books"))["output"] == "acme's own"
    refused = globex.http.post("/v1/runs", json={"agentName": "acme-books", "input": {}})
    assert refused.status_code == 404, refused.text
    assert "acme" not in refused.json()["detail"].replace("acme-books", "")
    schedule = {"agentName": "acme-books", "every": "1h"}
    assert globex.http.put("/v1/schedules/nightly", json=schedule).status_code == 404
    assert globex.http.get("/v1/agents/acme-books").status_code == 404
    listed = globex.http.get("/v1/agents").json()["items"]
    assert "acme-books" not in [a["name"] for a in listed]
    assert "acme-books" in [a["name"] for a in acme.http.get("/v1/agents").json()["items"]]
