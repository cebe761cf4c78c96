"""Receipts through a real `lantern serve` (both backends): verified the way a third party
would, with a plain Ed25519 library, RFC 8785 and SHA-256, and the status code rules."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

import lantern
from lantern.demo.receiver import Receiver
from lantern.receipts.keys import private_pem
from tests.helpers import http_chain
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


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def client(server: Server, key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


@pytest.fixture
def api_server(module_server: Server) -> Server:
    """The module's server (both backends): each test's callers are in workspaces of their own."""
    return module_server


@pytest.fixture
def workspace() -> str:
    return f"alice-{secrets.token_hex(4)}"


@pytest.fixture
def alice(api_server: Server, workspace: str) -> Iterator[httpx.Client]:
    with client(api_server, make_key(api_server.database_url, workspace, ALL_SCOPES)) as http:
        assert http.put("/v1/agents/noop", json=NOOP).status_code == 200
        yield http


def finish(http: httpx.Client, agent: str = "noop", input: Any = None) -> dict[str, Any]:
    created = http.post("/v1/runs", json={"agentName": agent, "input": input or {"x": 7}})
    assert created.status_code == 202, created.text
    run: dict[str, Any] = http.get(f"/v1/runs/{created.json()['id']}", params={"wait": 20}).json()
    assert run["status"] in ("succeeded", "failed", "cancelled"), run
    return run


def third_party_verify(answer: dict[str, Any], jwks: dict[str, Any], events: list[Any]) -> None:
    """docs/receipts.md, step by step, with nothing of Lantern's code."""
    receipt = answer["receipt"]
    jwk = next(k for k in jwks["keys"] if k["kid"] == receipt["keyId"] == answer["keyId"])
    assert (jwk["kty"], jwk["crv"]) == ("OKP", "Ed25519")
    thumb = rfc8785.dumps({"crv": jwk["crv"], "kty": jwk["kty"], "x": jwk["x"]})
    assert (
        base64.urlsafe_b64encode(hashlib.sha256(thumb).digest()).rstrip(b"=") == jwk["kid"].encode()
    )
    key = Ed25519PublicKey.from_public_bytes(b64url_decode(jwk["x"]))
    key.verify(b64url_decode(answer["signature"]), rfc8785.dumps(receipt))  # raises if not
    head = "0" * 64
    for e in events:
        at_ms = round(datetime.fromisoformat(e["at"]).timestamp() * 1000)
        body = rfc8785.dumps(
            {
                "runId": e["runId"],
                "seq": e["seq"],
                "kind": e["kind"],
                "stepId": e["stepId"],
                "nodeId": e["nodeId"],
                "attempt": e["attempt"],
                "atMs": at_ms,
                "data": e["data"],
            }
        )
        head = hashlib.sha256(head.encode() + b"." + body).hexdigest()
        assert e["hash"] == head, f"event {e['seq']}"
    assert receipt["journalHead"] == f"sha256:{head}"
    assert receipt["eventCount"] == len(events)
    last = events[-1]
    output = last["data"]["output"] if last["kind"] == "run_succeeded" else None
    assert receipt["outputDigest"] == "sha256:" + hashlib.sha256(rfc8785.dumps(output)).hexdigest()


def test_a_receipt_verifies_with_a_plain_ed25519_library(
    api_server: Server, alice: httpx.Client, workspace: str
) -> None:
    run = finish(alice)
    answer = alice.get(f"/v1/runs/{run['id']}/receipt")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    receipt = body["receipt"]
    assert receipt["runId"] == run["id"] and receipt["workspace"] == workspace
    assert (receipt["agentName"], receipt["agentVersion"], receipt["status"]) == (
        "noop",
        1,
        "succeeded",
    )
    assert receipt["usage"] == run["usage"] and receipt["issuedAt"].endswith("Z")
    jwks = httpx.get(f"{api_server.url}/v1/receipts/keys", timeout=10).json()  # no key needed
    events = alice.get(f"/v1/runs/{run['id']}/events").json()["items"]
    third_party_verify(body, jwks, events)
    assert events[-1]["data"]["output"] == run["output"]
    # Asked again, the same receipt: it is stored, not signed anew.
    assert alice.get(f"/v1/runs/{run['id']}/receipt").json() == body


def test_a_receipt_read_as_soon_as_the_run_is_answered_is_the_one_kept(
    api_server: Server, alice: httpx.Client
) -> None:
    """The server issues receipts in the background, after answering the run's waiter: a read
    right after ``POST ?wait`` issues the receipt itself, and the background issue that may
    race it must not leave the run with another. (Graph runs here; every kind of run reaches
    the same hook with its id, so the batch treats them alike.)"""
    answers: list[tuple[str, dict[str, Any]]] = []
    for i in range(8):
        made = alice.post(
            "/v1/runs", params={"wait": 20}, json={"agentName": "noop", "input": {"x": i}}
        )
        assert made.status_code == 200 and made.json()["status"] == "succeeded", made.text
        read = alice.get(f"/v1/runs/{made.json()['id']}/receipt")
        assert read.status_code == 200, read.text
        answers.append((made.json()["id"], read.json()))
    jwks = httpx.get(f"{api_server.url}/v1/receipts/keys", timeout=10).json()
    time.sleep(0.3)  # the background issue has long been stored by now
    for run_id, first in answers:
        assert alice.get(f"/v1/runs/{run_id}/receipt").json() == first
        events = alice.get(f"/v1/runs/{run_id}/events").json()["items"]
        third_party_verify(first, jwks, events)


def test_receipt_status_codes(
    api_server: Server, alice: httpx.Client, workspace: str, receiver: Receiver
) -> None:
    run = finish(alice)
    path = f"/v1/runs/{run['id']}/receipt"
    db = api_server.database_url
    with client(api_server, None) as anonymous:
        assert anonymous.get(path).status_code == 401
    with client(api_server, make_key(db, f"bob-{workspace}", ALL_SCOPES)) as bob:
        answer = bob.get(path)
        assert answer.status_code == 403 and "another workspace" in answer.json()["detail"]
        assert "receipt" not in answer.text
    with client(api_server, make_key(db, workspace, "agents:read")) as no_scope:
        assert no_scope.get(path).status_code == 403
    unknown = alice.get("/v1/runs/run_nothere/receipt")
    assert unknown.status_code == 404
    assert unknown.headers["content-type"].startswith("application/problem+json")
    # A run still going has no receipt yet; once finished, it has.
    assert alice.put("/v1/agents/chain", json=http_chain("chain", receiver.url, 1)).is_success
    receiver.hold("/s1")
    held = alice.post("/v1/runs", json={"agentName": "chain", "input": {}}).json()
    assert receiver.arrived.wait(20)
    early = alice.get(f"/v1/runs/{held['id']}/receipt")
    assert early.status_code == 409 and "not finished" in early.json()["detail"], early.text
    assert early.headers["content-type"].startswith("application/problem+json")
    receiver.release()
    assert alice.get(f"/v1/runs/{held['id']}", params={"wait": 20}).json()["status"] == "succeeded"
    assert alice.get(f"/v1/runs/{held['id']}/receipt").status_code == 200


def test_a_cancelled_run_gets_a_receipt_with_the_null_output(
    api_server: Server, alice: httpx.Client, receiver: Receiver
) -> None:
    assert alice.put("/v1/agents/chain", json=http_chain("chain", receiver.url, 2)).is_success
    receiver.hold("/s1")
    run = alice.post("/v1/runs", json={"agentName": "chain", "input": {}}).json()
    assert receiver.arrived.wait(20)
    assert alice.post(f"/v1/runs/{run['id']}/cancel").status_code == 202
    done = alice.get(f"/v1/runs/{run['id']}", params={"wait": 20}).json()
    receiver.release()
    assert done["status"] == "cancelled"
    body = alice.get(f"/v1/runs/{run['id']}/receipt").json()
    assert body["receipt"]["status"] == "cancelled"
    assert body["receipt"]["outputDigest"] == "sha256:" + hashlib.sha256(b"null").hexdigest()
    jwks = alice.get("/v1/receipts/keys").json()
    third_party_verify(body, jwks, alice.get(f"/v1/runs/{run['id']}/events").json()["items"])


def cli(server: Server, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LANTERN_URL": server.url, "LANTERN_API_KEY": key}
    return subprocess.run([LANTERN, *args], env=env, capture_output=True, text=True, timeout=60)


def test_a_rotated_key_still_verifies_old_receipts(database_url: str, tmp_path: Path) -> None:
    old, new = (private_pem(Ed25519PrivateKey.generate()).decode() for _ in range(2))
    first = Server(database_url, tmp_path / "a.log", env={"LANTERN_SIGNING_KEY": old}).start()
    key = make_key(database_url, "alice", ALL_SCOPES)
    try:
        with client(first, key) as http:
            assert http.put("/v1/agents/noop", json=NOOP).status_code == 200
            before = http.get(f"/v1/runs/{finish(http)['id']}/receipt").json()
    finally:
        first.stop()
    # Only the new key is configured now: it signs, and the old one still verifies.
    second = Server(database_url, tmp_path / "b.log", env={"LANTERN_SIGNING_KEY": new}).start()
    try:
        with client(second, key) as http:
            run_id = before["receipt"]["runId"]
            after = http.get(f"/v1/runs/{finish(http)['id']}/receipt").json()
            assert after["keyId"] != before["keyId"]
            jwks = http.get("/v1/receipts/keys").json()
            assert {k["kid"] for k in jwks["keys"]} == {before["keyId"], after["keyId"]}
            assert http.get(f"/v1/runs/{run_id}/receipt").json() == before
            for answer in (before, after):
                rid = answer["receipt"]["runId"]
                third_party_verify(answer, jwks, http.get(f"/v1/runs/{rid}/events").json()["items"])
        # The CLI over the API: by run id, and an export checked against the keys' URL.
        verified = cli(second, key, "receipt", "verify", run_id)
        assert verified.returncode == 0, verified.stderr
        assert verified.stdout.startswith("receipt verified") and before["keyId"] in verified.stdout
        export = tmp_path / "export.json"
        assert cli(second, key, "runs", "export", run_id, "-o", str(export)).returncode == 0
        keys_url = f"{second.url}/v1/receipts/keys"
        offline = subprocess.run(
            [LANTERN, "receipt", "verify", str(export), "--keys", keys_url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert offline.returncode == 0, offline.stderr
    finally:
        second.stop()


def test_the_sdk_reads_receipts_and_keys(api_server: Server, alice: httpx.Client) -> None:
    run = finish(alice)
    key = alice.headers["authorization"].removeprefix("Bearer ")

    async def read() -> tuple[lantern.Receipt, list[dict[str, Any]]]:
        async with lantern.AsyncClient(api_server.url, key) as api:
            with pytest.raises(lantern.NotFoundError):
                await api.receipt("run_nothere")
            return await api.receipt(run["id"]), await api.receipt_keys()

    signed, keys = asyncio.run(read())
    assert isinstance(signed, lantern.Receipt) and signed.key_id == signed.receipt["keyId"]
    assert signed.to_json() == alice.get(f"/v1/runs/{run['id']}/receipt").json()
    assert [k["kid"] for k in keys] == [signed.key_id]
    with lantern.Client(api_server.url, key) as sync:
        assert sync.receipt(run["id"]) == signed
        assert sync.receipt_keys() == keys
