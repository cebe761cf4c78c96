"""A stdio MCP server (tests/mcp/probe_server.py, written with the `mcp` SDK) started by a real
`lantern serve`: it sees only PATH, HOME, the locale and what `app.mcp(env=..., cwd=...)` gives
it, never the server's own variables, and it dies with the server, even in the middle of a
long call, and so do the processes it started. MCP tools are called the same way by graph,
plain, code-first and microVM runs (a VM asks the control plane, which calls the tool), so one
server process serves them all."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hostile.kit import Tenant
from tests.server import ROOT, Server

SECRET_KEY = "a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2s="
API_KEY = "sk-test-not-for-mcp-servers"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, Any]]:
    log = tmp_path / "notes.jsonl"
    env = {
        "NOTES_LOG": str(log),
        "LANTERN_SECRETS_KEY": SECRET_KEY,
        "OPENAI_API_KEY": API_KEY,
        "LANG": "C.UTF-8",
    }
    server = Server(
        f"sqlite:///{tmp_path / 'lantern.db'}",
        tmp_path / "serve.log",
        env=env,
        app="tests.hostile.mcp_app:app",
    ).start()
    tenant = Tenant(server, "default", "runs:execute,runs:read,agents:write,agents:read")
    yield {"server": server, "tenant": tenant, "log": log}
    tenant.close()
    if server.proc is not None and server.proc.poll() is None:
        server.stop()


def tool_agent(name: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "call", "type": "tool", "data": {"tool": tool, "args": args}},
            ],
            "edges": [{"source": "start", "target": "call"}],
        },
    }


def calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_a_stdio_server_sees_no_secret_of_the_server(world: dict[str, Any]) -> None:
    tenant: Tenant = world["tenant"]
    assert tenant.apply(tool_agent("env", "notes.environment", {})).status_code == 200
    run = tenant.finished(tenant.start("env"))
    assert run["status"] == "succeeded", run
    seen: dict[str, str] = run["output"]
    assert not [k for k in seen if k.startswith("LANTERN_")], sorted(seen)
    assert not [k for k in seen if k.endswith("_API_KEY")], sorted(seen)
    assert SECRET_KEY not in json.dumps(seen) and API_KEY not in json.dumps(seen)
    # What it is given: the allow-list, env= and cwd=.
    assert seen["PATH"] and seen["LANG"] == "C.UTF-8"
    assert seen["PYTHONPATH"] == str(ROOT) and seen["NOTES_LOG"] == str(world["log"])
    assert seen["PWD"] == str(ROOT)


def test_a_stdio_server_dies_with_its_server_mid_call(world: dict[str, Any]) -> None:
    server: Server = world["server"]
    tenant: Tenant = world["tenant"]
    assert tenant.apply(tool_agent("long", "notes.hold", {"seconds": 120})).status_code == 200
    tenant.start("long")
    deadline = time.monotonic() + 30
    while not [c for c in calls(world["log"]) if c["tool"] == "hold"]:
        assert time.monotonic() < deadline, "the long call never reached the MCP server"
        time.sleep(0.05)
    call = next(c for c in calls(world["log"]) if c["tool"] == "hold")
    assert alive(call["pid"]) and alive(call["child"])
    server.kill()  # SIGKILL: no shutdown code runs
    deadline = time.monotonic() + 5
    for what, pid in (("MCP server", call["pid"]), ("its child", call["child"])):
        while alive(pid):
            assert time.monotonic() < deadline, f"{what} {pid} outlived its lantern serve"
            time.sleep(0.05)
