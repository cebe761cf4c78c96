"""Large outputs read back, and runs deleted, through a real `lantern serve` (both backends).

The graph run here stores its 40 KiB output apart like every other kind of run does (plain,
code-first and microVM runs write step outputs through the same EventWriter.completed); what
deletion removes does not depend on the kind of run either (tests/conformance).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import lantern
from lantern.demo.receiver import Receiver
from tests.helpers import http_chain, wait_until
from tests.server import ALL_SCOPES, Server, make_key

LANTERN = str(Path(sys.executable).parent / "lantern")
NOOP = {
    "name": "noop",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "t", "type": "tool", "data": {"tool": "noop", "args": {"x": "{{ input.x }}"}}},
        ],
        "edges": [{"source": "start", "target": "t"}],
    },
}
PARKED = {
    "name": "parked",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "ok", "type": "approval", "data": {"prompt": "Go on?"}},
        ],
        "edges": [{"source": "start", "target": "ok"}],
    },
}
BIG = {"x": 7, "page": "é" * 20 * 1024}  # 40 KiB of UTF-8: stored apart (over 16 KiB)


def client(server: Server, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def finish(http: httpx.Client, agent: str, input: Any) -> str:
    created = http.post("/v1/runs", json={"agentName": agent, "input": input})
    assert created.status_code == 202, created.text
    run_id: str = created.json()["id"]
    assert http.get(f"/v1/runs/{run_id}", params={"wait": 30}).json()["status"] == "succeeded"
    return run_id


def cli(server: Server, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LANTERN_URL": server.url, "LANTERN_API_KEY": key}
    return subprocess.run([LANTERN, *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def alice(api_server: Server) -> Iterator[httpx.Client]:
    with client(api_server, make_key(api_server.database_url, "alice", ALL_SCOPES)) as http:
        assert http.put("/v1/agents/noop", json=NOOP).status_code == 200
        yield http


def test_a_large_output_reads_back_everywhere_and_its_run_deletes(
    api_server: Server, alice: httpx.Client, tmp_path: Path
) -> None:
    run_id = finish(alice, "noop", BIG)
    path = f"/v1/runs/{run_id}"
    plain = alice.get(f"{path}/events").json()["items"]
    stored = next(e for e in plain if e["kind"] == "step_completed" and e["stepId"] == "start")
    ref = stored["data"]["outputRef"]
    assert stored["data"]["outputBytes"] > 40 * 1024 and "output" not in stored["data"]

    expanded = alice.get(f"{path}/events", params={"expand": "outputs"}).json()["items"]
    inline = next(e for e in expanded if e["seq"] == stored["seq"])
    assert inline["data"] == {**stored["data"], "output": BIG}
    blob = alice.get(f"{path}/blobs/{ref}")
    assert blob.status_code == 200 and blob.json() == BIG
    assert alice.get(f"{path}/blobs/sha256:{'0' * 64}").status_code == 404

    with lantern.Client(api_server.url, alice.headers["Authorization"][7:]) as sdk:
        events = sdk.events(run_id, expand_outputs=True)
        assert next(e for e in events if e.seq == stored["seq"]).data["output"] == BIG
        assert sdk.blob(run_id, ref) == BIG

    # Another workspace: refused as for the run itself, even holding the same output.
    bob_key = make_key(api_server.database_url, "bob", ALL_SCOPES)
    with client(api_server, bob_key) as bob:
        assert bob.put("/v1/agents/noop", json=NOOP).status_code == 200
        bobs = finish(bob, "noop", BIG)
        assert bob.get(f"{path}/blobs/{ref}").status_code == 403
        assert bob.get(f"{path}/events", params={"expand": "outputs"}).status_code == 403
        assert bob.delete(path).status_code == 403
        assert bob.get(f"/v1/runs/{bobs}/blobs/{ref}").json() == BIG

    # The export holds the value inline and verifies offline, before and after the deletion.
    export, keys = tmp_path / "export.json", tmp_path / "keys.json"
    key = alice.headers["Authorization"][7:]
    made = cli(api_server, key, "runs", "export", run_id, "-o", str(export))
    assert made.returncode == 0, made.stderr
    doc = json.loads(export.read_text())
    assert next(e for e in doc["events"] if e["seq"] == stored["seq"])["data"]["output"] == BIG
    keys.write_text(json.dumps(alice.get("/v1/receipts/keys").json()))
    verify = [LANTERN, "receipt", "verify", str(export), "--keys", str(keys)]
    assert subprocess.run(verify, capture_output=True, timeout=60).returncode == 0

    assert alice.delete(path).status_code == 204
    for gone in ("", "/events", f"/blobs/{ref}", "/receipt", "/stream", "/deliveries"):
        assert alice.get(f"{path}{gone}").status_code == 404, gone
    assert alice.delete(path).status_code == 404
    with client(api_server, bob_key) as bob:  # the shared blob stays for bob's run
        assert bob.get(f"/v1/runs/{bobs}/blobs/{ref}").json() == BIG
    checked = subprocess.run(verify, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr

    # A changed inline value no longer matches its reference.
    inline_doc = next(e for e in doc["events"] if e["seq"] == stored["seq"])
    inline_doc["data"]["output"] = {**BIG, "x": 8}
    export.write_text(json.dumps(doc))
    tampered = subprocess.run(verify, capture_output=True, text=True, timeout=60)
    assert tampered.returncode == 1 and "outputRef" in tampered.stderr


def test_retention_spares_runs_in_flight(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    env = {"LANTERN_RETENTION": "1s", "LANTERN_RECOVERY_INTERVAL": "250ms"}
    server = Server(database_url, tmp_path / "serve.log", env=env).start()
    try:
        with client(server, make_key(database_url, "alice", ALL_SCOPES + ",admin")) as http:
            for agent in (NOOP, PARKED, http_chain("chain", receiver.url, 2)):
                assert http.put(f"/v1/agents/{agent['name']}", json=agent).status_code == 200
            settings = http.get("/v1/workspace/settings").json()
            assert settings["effectiveRetention"] == "1s" and settings["retention"] is None
            assert http.put("/v1/workspace/settings", json={"retention": "soon"}).status_code == 422
            parked = http.post("/v1/runs", json={"agentName": "parked", "input": {}}).json()["id"]
            receiver.hold("/s2")
            running = http.post("/v1/runs", json={"agentName": "chain", "input": {}}).json()["id"]
            assert receiver.arrived.wait(20)
            wait_until(lambda: http.get(f"/v1/runs/{parked}").json()["status"] == "waiting")
            assert http.delete(f"/v1/runs/{running}").status_code == 409
            assert http.delete(f"/v1/runs/{parked}").status_code == 409
            old = finish(http, "noop", BIG)
            wait_until(lambda: http.get(f"/v1/runs/{old}").status_code == 404, timeout=30)
            metrics = httpx.get(f"{server.url}/metrics").text
            assert "lantern_retention_rows_deleted_total" in metrics
            assert "lantern_database_size_bytes" in metrics
            # The runs in flight kept every event, and go on to finish.
            for kept in (parked, running):
                assert len(http.get(f"/v1/runs/{kept}/events").json()["items"]) >= 3
            approved = http.post(f"/v1/runs/{parked}/approvals/ok", json={"decision": "approve"})
            assert approved.status_code == 202
            receiver.release()
            for kept in (parked, running):
                done = http.get(f"/v1/runs/{kept}", params={"wait": 30}).json()
                assert done["status"] == "succeeded", done
    finally:
        server.stop()
