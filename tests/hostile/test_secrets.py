"""Secrets (docs/security.md) against a real `lantern serve`, a real peer and a real OTLP receiver.

A step substitutes the value where it dispatches (the peer receives it), and then the value is
nowhere else: not in the journal, an API answer, the export, the receipt, the server's log,
the spans, or the database file. Where the value would have been, `[secret NAME]` stands.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hostile.kit import Peer, Tenant, attack
from tests.otlp import OtlpReceiver
from tests.server import LANTERN, ROOT, Server

VALUE = "sk-live-7f3a9c0e1d2b4a65"
SCOPES = "runs:execute,runs:read,agents:write,agents:read,secrets:write,secrets:read"
FORMS = [VALUE, VALUE.replace("-", "%2D")]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp: Path = tmp_path_factory.mktemp("secrets")
    peer = Peer(echo=True)
    otlp = OtlpReceiver().start()
    env = {
        "LANTERN_EGRESS_ALLOW": f"127.0.0.1:{peer.port}",
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    server = Server(f"sqlite:///{tmp / 'lantern.db'}", tmp / "serve.log", env=env).start()
    alice = Tenant(server, "alice", SCOPES)
    bob = Tenant(server, "bob", SCOPES)
    yield {"server": server, "peer": peer, "otlp": otlp, "alice": alice, "bob": bob, "tmp": tmp}
    alice.close()
    bob.close()
    server.stop()
    otlp.close()
    peer.close()


def agent(name: str, peer: Peer) -> dict[str, Any]:
    auth = {"Authorization": "Bearer {{ secrets.TOKEN }}"}
    return {
        "name": name,
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {
                    "id": "call",
                    "type": "connector",
                    "data": {
                        "connector": "http",
                        "method": "POST",
                        "url": f"{peer.url}/ok",
                        "headers": auth,
                        "body": {"token": "{{ secrets.TOKEN }}"},
                    },
                },
                {
                    "id": "tool",
                    "type": "tool",
                    "data": {"tool": "noop", "args": {"t": "key={{ secrets.TOKEN }}"}},
                },
                {
                    "id": "fail",
                    "type": "connector",
                    "data": {
                        "connector": "http",
                        "method": "GET",
                        "url": f"{peer.url}/fail/{{{{ secrets.TOKEN }}}}",
                        "headers": auth,
                        "retry": {"maxAttempts": 2, "backoffMs": 10},
                    },
                },
            ],
            "edges": [
                {"source": "start", "target": "call"},
                {"source": "call", "target": "tool"},
                {"source": "tool", "target": "fail"},
            ],
        },
    }


def absent(where: str, text: str | bytes) -> None:
    data = text.encode() if isinstance(text, str) else text
    for form in FORMS:
        assert form.encode() not in data, f"the secret's value is in {where}"


def test_a_secret_reaches_its_peer_and_nothing_else(world: dict[str, Any]) -> None:
    server, peer, otlp = world["server"], world["peer"], world["otlp"]
    alice: Tenant = world["alice"]
    with attack(server, "secrets", 4):
        put = alice.http.put("/v1/secrets/TOKEN", json={"value": VALUE})
        assert put.status_code == 200, put.text
        assert set(put.json()) == {"name", "createdAt", "updatedAt"}
        assert alice.apply(agent("leaky", peer)).status_code == 200
        run_id = alice.start("leaky", {"q": 1})
        run = alice.finished(run_id)
    assert run["status"] == "failed", run

    # It was substituted where the step dispatched: header, body and URL path.
    assert sum(VALUE.encode() in r for r in peer.received) >= 3

    events = alice.events(run_id)
    answers = [
        json.dumps(run),
        json.dumps(events),
        alice.http.get("/v1/runs", params={"limit": 50}).text,
        alice.http.get("/v1/secrets").text,
        alice.http.get("/v1/agents/leaky").text,
        alice.http.get(f"/v1/runs/{run_id}/receipt").text,
        httpx.get(f"{server.url}/ui/runs/{run_id}", timeout=10).text,
    ]
    for i, text in enumerate(answers):
        absent(f"API answer {i}", text)
    # Where the value was, its name stands: the echoed output, the tool's, and the error.
    shown = json.dumps(events)
    assert "Bearer [secret TOKEN]" in shown and "key=[secret TOKEN]" in shown
    assert "/fail/[secret TOKEN]" in json.dumps(run["error"])
    assert [e for e in events if e["kind"] == "step_retrying"]

    export = subprocess.run(
        [LANTERN, "runs", "export", run_id],
        env={
            **os.environ,
            "LANTERN_DATABASE_URL": server.database_url,
            "LANTERN_DATA_DIR": str(world["tmp"]),
            "PYTHONPATH": str(ROOT),
        },
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert export.returncode == 0, export.stderr
    assert json.loads(export.stdout)["receipt"]
    absent("the export", export.stdout)

    deadline = time.monotonic() + 10
    while not any(b"lantern.step" in r or b"call" in r for r in otlp.raw):
        assert time.monotonic() < deadline, "no spans arrived"
        time.sleep(0.1)
    time.sleep(0.5)  # the batch with the failed step's span
    absent("the spans", b"".join(otlp.raw))
    assert otlp.raw

    absent("the server's log", world["server"].log.read_bytes())
    for f in world["tmp"].glob("lantern.db*"):
        absent(f"the database file {f.name}", f.read_bytes())
    key_file = world["tmp"] / "secrets.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_a_workspace_uses_and_sees_only_its_own(world: dict[str, Any]) -> None:
    server, peer = world["server"], world["peer"]
    alice: Tenant = world["alice"]
    bob: Tenant = world["bob"]
    assert alice.http.put("/v1/secrets/TOKEN", json={"value": VALUE}).status_code == 200
    with attack(server, "secrets", 3):
        assert bob.http.get("/v1/secrets").json() == {"items": []}
        assert bob.http.delete("/v1/secrets/TOKEN").status_code == 404
        assert bob.apply(agent("borrow", peer)).status_code == 200
        run = bob.finished(bob.start("borrow"))
    assert run["status"] == "failed"
    assert "TOKEN" in run["error"]["message"], run["error"]
    absent("bob's run", json.dumps(run))
    assert [s["name"] for s in alice.http.get("/v1/secrets").json()["items"]] == ["TOKEN"]


def test_bad_secret_requests_are_refused_and_change_nothing(world: dict[str, Any]) -> None:
    server = world["server"]
    alice: Tenant = world["alice"]
    reader = Tenant(server, "alice", "secrets:read")
    writer = Tenant(server, "alice", "secrets:write")
    try:
        before = alice.http.get("/v1/secrets").json()
        with attack(server, "secrets", 9):
            bad = [
                (alice.http.put("/v1/secrets/1BAD", json={"value": VALUE}), 422),
                (alice.http.put("/v1/secrets/SHORT", json={"value": "abc"}), 422),
                (alice.http.put("/v1/secrets/NUMBER", json={"value": 12345678}), 422),
                (alice.http.put("/v1/secrets/EXTRA", json={"value": VALUE, "x": 1}), 422),
                (alice.http.put("/v1/secrets/NOBODY", content=b"{not json"), 400),
                (reader.http.put("/v1/secrets/TOKEN", json={"value": VALUE + "x"}), 403),
                (reader.http.delete("/v1/secrets/TOKEN"), 403),
                (writer.http.get("/v1/secrets"), 403),
                (httpx.get(f"{server.url}/v1/secrets", timeout=10), 401),
            ]
            for response, status in bad:
                assert response.status_code == status, response.text
                assert response.headers["content-type"].startswith("application/problem+json")
                absent("a refusal", response.text)
        assert alice.http.get("/v1/secrets").json() == before
    finally:
        reader.close()
        writer.close()


def test_the_cli_sets_lists_and_deletes_with_the_server_s_key(world: dict[str, Any]) -> None:
    server, peer = world["server"], world["peer"]
    alice: Tenant = world["alice"]
    env = {
        **os.environ,
        "LANTERN_DATABASE_URL": server.database_url,
        "LANTERN_DATA_DIR": str(world["tmp"]),
        "PYTHONPATH": str(ROOT),
    }

    def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [LANTERN, "secrets", *args],
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )

    assert cli("set", "CLI_TOKEN", "--workspace", "alice", stdin=VALUE + "\n").returncode == 0
    listed = cli("list", "--workspace", "alice")
    assert "CLI_TOKEN" in listed.stdout
    absent("the CLI's output", listed.stdout + listed.stderr)
    short = cli("set", "X", "--workspace", "alice", stdin="ab")
    assert short.returncode == 2 and short.stderr.count("\n") == 1, short
    # The server opens what the CLI sealed: they share the data dir's key.
    definition = {
        "name": "cli-made",
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {
                    "id": "call",
                    "type": "connector",
                    "data": {
                        "connector": "http",
                        "url": f"{peer.url}/cli",
                        "body": {"t": "{{ secrets.CLI_TOKEN }}"},
                    },
                },
            ],
            "edges": [{"source": "start", "target": "call"}],
        },
    }
    assert alice.apply(definition).status_code == 200
    run = alice.finished(alice.start("cli-made"))
    assert run["status"] == "succeeded", run
    assert any(b"/cli" in r and VALUE.encode() in r for r in peer.received)
    absent("the run", json.dumps(run))
    assert cli("delete", "CLI_TOKEN", "--workspace", "alice").returncode == 0
    assert cli("delete", "CLI_TOKEN", "--workspace", "alice").returncode == 1
    again = alice.finished(alice.start("cli-made"))
    assert again["status"] == "failed" and "CLI_TOKEN" in again["error"]["message"]
