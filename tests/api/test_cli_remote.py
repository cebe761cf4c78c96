"""The CLI talks to a server when LANTERN_URL and LANTERN_API_KEY are set."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path

import pytest

from lantern.demo.receiver import Receiver
from tests.api.test_endpoints import NOOP
from tests.server import ALL_SCOPES, LANTERN, Server, make_key


def lantern(server: Server, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LANTERN_DATABASE_URL", "LANTERN_URL")}
    # No database: everything must go through the API.
    env |= {
        "LANTERN_URL": server.url,
        "LANTERN_API_KEY": key,
        "LANTERN_DATABASE_URL": "sqlite:////nonexistent/dir/never.db",
    }
    return subprocess.run([LANTERN, *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def api_server(module_server: Server) -> Server:
    """The module's server (both backends): each test's key is in a workspace of its own."""
    return module_server


def own_key(server: Server) -> str:
    return make_key(server.database_url, f"w{secrets.token_hex(4)}", ALL_SCOPES)


def test_cli_over_the_api(api_server: Server, tmp_path: Path) -> None:
    key = own_key(api_server)
    agent_file = tmp_path / "noop.json"
    agent_file.write_text(json.dumps(NOOP))
    applied = lantern(api_server, key, "agents", "apply", str(agent_file))
    assert applied.returncode == 0 and "applied noop v1" in applied.stdout, applied.stderr
    assert "noop" in lantern(api_server, key, "agents", "list").stdout

    done = lantern(api_server, key, "run", "noop", "--input", '{"x": 7}', "--wait")
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    assert run["status"] == "succeeded" and run["output"] == {"x": 7}
    queued = lantern(api_server, key, "run", "noop", "--input", '{"x": 8}')
    assert queued.returncode == 0 and queued.stdout.strip().startswith("run_")

    listed = lantern(api_server, key, "runs", "list")
    assert run["id"] in listed.stdout and queued.stdout.strip() in listed.stdout
    shown = lantern(api_server, key, "runs", "show", run["id"])
    assert shown.returncode == 0 and "start" in shown.stdout and "completed" in shown.stdout

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "bad", "graph": {"nodes": [], "edges": []}}))
    refused = lantern(api_server, key, "agents", "apply", str(bad))
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    missing = lantern(api_server, key, "runs", "show", "run_missing")
    assert missing.returncode == 1 and "not found" in missing.stderr
    wrong = lantern(api_server, "lk_wrong_key", "runs", "list")
    assert wrong.returncode == 1 and len(wrong.stderr.strip().splitlines()) == 1


def test_workers_list_shows_the_running_replica(api_server: Server) -> None:
    env = {**os.environ, "LANTERN_DATABASE_URL": api_server.database_url, "COLUMNS": "200"}
    shown = subprocess.run(
        [LANTERN, "workers", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert f"test-{api_server.port}" in shown.stdout and "heartbeat" in shown.stdout


def test_remote_runs_show_lists_deliveries(api_server: Server, receiver: Receiver) -> None:
    from lantern import Client
    from tests.crash.test_deliver_once import deliveries_agent

    key = own_key(api_server)
    with Client(api_server.url, key) as client:
        client.apply_agent(deliveries_agent(receiver.url, gate_first=False))
        run = client.wait(client.create_run("pay", {}).id, timeout=30)
        assert run.status == "succeeded"
        sent = client.deliveries(run.id)
    assert [(d.name, d.status) for d in sent] == [("first", "delivered"), ("second", "delivered")]
    shown = lantern(api_server, key, "runs", "show", run.id)
    assert shown.returncode == 0, shown.stderr
    assert "first" in shown.stdout and "second" in shown.stdout and "delivered" in shown.stdout
