"""Every endpoint, scope and status of the REST API (its OpenAPI document at `/openapi.json`)
against a real `lantern serve`."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import httpx
import pytest

from lantern.demo.receiver import Receiver
from lantern.server.auth import VERIFIED_S
from tests.helpers import http_chain
from tests.server import ALL_SCOPES, Server, make_key

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


class Caller:
    """An HTTP client holding one API key (of ``workspace``); closed when the test ends."""

    opened: ClassVar[list[httpx.Client]] = []

    def __init__(self, server: Server, key: str | None, workspace: str = "") -> None:
        self.workspace = workspace
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=server.url, headers=headers, timeout=30)
        Caller.opened.append(self.http)

    def __getattr__(self, method: str) -> Any:
        return getattr(self.http, method)


@pytest.fixture(autouse=True)
def close_callers() -> Iterator[None]:
    yield
    while Caller.opened:
        Caller.opened.pop().close()


@pytest.fixture
def api_server(module_server: Server) -> Server:
    """The module's server (both backends): each test's callers are in workspaces of their own."""
    return module_server


def caller(server: Server, name: str, scopes: str = ALL_SCOPES) -> Caller:
    workspace = f"{name}-{secrets.token_hex(4)}"
    return Caller(server, make_key(server.database_url, workspace, scopes), workspace)


@pytest.fixture
def alice(api_server: Server) -> Caller:
    return caller(api_server, "alice")


@pytest.fixture
def bob(api_server: Server) -> Caller:
    return caller(api_server, "bob")


def is_problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["title"] and body["detail"] and body["type"]
    return body


def finished(caller: Caller, run_id: str) -> dict[str, Any]:
    body: dict[str, Any] = caller.get(f"/v1/runs/{run_id}", params={"wait": 20}).json()
    assert body["status"] in ("succeeded", "failed", "cancelled"), body
    return body


def test_public_endpoints_need_no_key(api_server: Server) -> None:
    anonymous = Caller(api_server, None)
    assert anonymous.get("/healthz").json() == {"status": "ok"}
    assert anonymous.get("/openapi.json").json()["paths"]["/v1/runs"]
    metrics = anonymous.get("/metrics")
    assert metrics.status_code == 200 and "# TYPE" in metrics.text


def test_agents_are_versioned_and_validated(alice: Caller) -> None:
    first = alice.put("/v1/agents/noop", json=NOOP)
    assert first.status_code == 200 and first.json()["version"] == 1
    assert alice.put("/v1/agents/noop", json=NOOP).json()["version"] == 2
    assert alice.get("/v1/agents/noop").json()["version"] == 2
    assert alice.get("/v1/agents/noop", params={"version": 1}).json()["definition"] == NOOP
    bad = {"name": "broken", "graph": {"nodes": [{"id": "x", "type": "warp"}], "edges": []}}
    problem = is_problem(alice.put("/v1/agents/broken", json=bad), 422)
    assert any("warp" in e for e in problem["errors"]) and any(
        "trigger" in e for e in problem["errors"]
    )
    is_problem(alice.get("/v1/agents/broken"), 404)  # nothing was stored
    is_problem(alice.put("/v1/agents/other", json=NOOP), 422)  # the name must match the path
    for name in ("a1", "a2", "a3"):
        alice.put(f"/v1/agents/{name}", json={**NOOP, "name": name})
    page = alice.get("/v1/agents", params={"limit": 2}).json()
    rest = alice.get("/v1/agents", params={"limit": 2, "cursor": page["nextCursor"]}).json()
    names = [a["name"] for a in page["items"] + rest["items"]]
    assert names == ["a1", "a2", "a3", "noop"] and rest["nextCursor"] is None


def test_runs_are_created_idempotently_and_followed(alice: Caller) -> None:
    alice.put("/v1/agents/noop", json=NOOP)
    headers = {"Idempotency-Key": "order-1"}
    created = alice.post("/v1/runs", json={"agentName": "noop", "input": {"x": 1}}, headers=headers)
    assert created.status_code == 202 and created.json()["status"] in ("queued", "running")
    run_id = created.json()["id"]
    again = alice.post("/v1/runs", json={"agentName": "noop", "input": {"x": 1}}, headers=headers)
    assert again.status_code == 202 and again.json()["id"] == run_id
    other = alice.post("/v1/runs", json={"agentName": "noop", "input": {"x": 2}}, headers=headers)
    is_problem(other, 409)

    run = finished(alice, run_id)
    assert run["status"] == "succeeded" and run["output"] == {"x": 1}
    assert run["usage"] == {"inputTokens": 0, "outputTokens": 0, "costUsd": 0.0, "modelCalls": 0}
    events = alice.get(f"/v1/runs/{run_id}/events").json()["items"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["kind"] == "run_started" and events[-1]["kind"] == "run_succeeded"
    later = alice.get(f"/v1/runs/{run_id}/events", params={"after": 3}).json()["items"]
    assert [e["seq"] for e in later] == [e["seq"] for e in events[3:]]
    page = alice.get(f"/v1/runs/{run_id}/events", params={"limit": 2}).json()
    assert len(page["items"]) == 2 and page["nextAfter"] == 2
    # An event's members (docs/streaming.md), and its hash in the chain a receipt is signed over.
    contract = {"seq", "runId", "stepId", "nodeId", "kind", "attempt", "data", "at"}
    assert set(events[0]) == contract | {"hash"} and len(events[0]["hash"]) == 64
    assert alice.get("/v1/runs", params={"limit": 200}).json()["items"][0]["id"] == run_id


def test_lists_page_and_filter(alice: Caller) -> None:
    alice.put("/v1/agents/noop", json=NOOP)
    ids = [
        alice.post("/v1/runs", json={"agentName": "noop", "input": {"x": i}}).json()["id"]
        for i in range(5)
    ]
    for run_id in ids:
        finished(alice, run_id)
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = alice.get("/v1/runs", params=params).json()
        seen += [r["id"] for r in page["items"]]
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert seen == sorted(ids, reverse=True)
    assert len(alice.get("/v1/runs", params={"status": "succeeded"}).json()["items"]) == 5
    assert alice.get("/v1/runs", params={"status": "failed"}).json()["items"] == []
    assert alice.get("/v1/runs", params={"agentName": "other"}).json()["items"] == []
    is_problem(alice.get("/v1/runs", params={"cursor": "%%%"}), 422)
    is_problem(alice.get("/v1/runs", params={"status": "bogus"}), 422)


def test_bad_requests_are_problems_and_change_nothing(alice: Caller, api_server: Server) -> None:
    alice.put("/v1/agents/noop", json=NOOP)
    cases = [
        (
            alice.post("/v1/runs", content=b"{nope", headers={"content-type": "application/json"}),
            400,
        ),
        (
            alice.post(
                "/v1/runs",
                content=b"agentName=noop",
                headers={"content-type": "application/x-www-form-urlencoded"},
            ),
            400,
        ),
        (alice.post("/v1/runs", json={"input": {}}), 422),
        (alice.post("/v1/runs", json={"agentName": "noop", "extra": 1}), 422),
        (alice.post("/v1/runs", json={"agentName": "ghost"}), 404),
        (
            alice.post(
                "/v1/runs",
                content=b"x" * (10 * 1024 * 1024 + 1),
                headers={"content-type": "application/json"},
            ),
            413,
        ),
        (alice.get("/v1/nowhere"), 404),
        (alice.delete("/v1/runs"), 405),
        (alice.get("/v1/runs/run_unknown"), 404),
        (alice.get("/v1/runs/run_unknown/events"), 404),
        (alice.post("/v1/runs/run_unknown/cancel"), 404),
    ]
    for response, status in cases:
        is_problem(response, status)
    assert alice.get("/v1/runs").json()["items"] == []


def test_keys_need_their_scopes(api_server: Server, alice: Caller) -> None:
    alice.put("/v1/agents/noop", json=NOOP)
    run_id = alice.post("/v1/runs", json={"agentName": "noop", "input": {"x": 0}}).json()["id"]
    finished(alice, run_id)
    calls: dict[str, Callable[[Caller], httpx.Response]] = {
        "runs:execute": lambda c: c.post("/v1/runs", json={"agentName": "noop"}),
        "runs:read": lambda c: c.get(f"/v1/runs/{run_id}"),
        "runs:approve": lambda c: c.post(
            f"/v1/runs/{run_id}/approvals/x", json={"decision": "approve"}
        ),
        "agents:write": lambda c: c.put("/v1/agents/noop", json=NOOP),
        "agents:read": lambda c: c.get("/v1/agents"),
    }
    for needed, call in calls.items():
        others = ",".join(s for s in ALL_SCOPES.split(",") if s != needed)
        lacking = Caller(api_server, make_key(api_server.database_url, alice.workspace, others))
        assert needed in is_problem(call(lacking), 403)["detail"]
        is_problem(call(Caller(api_server, None)), 401)
        is_problem(call(Caller(api_server, "lk_nothere_secret")), 401)
    admin = Caller(api_server, make_key(api_server.database_url, alice.workspace, "admin"))
    assert admin.get(f"/v1/runs/{run_id}").status_code == 200
    # No key's secret ever reaches the log, whether it was accepted or refused.
    log = api_server.log.read_text()
    assert "lk_" not in log and "nothere_secret" not in log


def test_a_revoked_key_is_refused(api_server: Server) -> None:
    import subprocess

    from tests.server import LANTERN

    reader = caller(api_server, "alice", "runs:read")
    key = reader.http.headers["authorization"].removeprefix("Bearer ")
    assert reader.get("/v1/runs").status_code == 200
    env = {"LANTERN_DATABASE_URL": api_server.database_url, "PATH": "/usr/bin:/bin"}
    key_id = key.split("_")[1]
    listed = subprocess.run([LANTERN, "keys", "list"], env=env, capture_output=True, text=True)
    assert key_id in listed.stdout and key.split("_", 2)[2] not in listed.stdout
    done = subprocess.run([LANTERN, "keys", "revoke", key_id], env=env, capture_output=True)
    assert done.returncode == 0
    # The server trusts a key it verified for up to VERIFIED_S (docs/security.md): the
    # revocation reaches it within that, however recently the key was used.
    revoked = time.monotonic()
    while reader.get("/v1/runs").status_code == 200 and time.monotonic() - revoked < VERIFIED_S:
        time.sleep(0.05)
    is_problem(reader.get("/v1/runs"), 401)


def test_workspaces_see_only_their_own(alice: Caller, bob: Caller) -> None:
    alice.put("/v1/agents/noop", json=NOOP)
    secret = "alice-private-input"
    run_id = alice.post("/v1/runs", json={"agentName": "noop", "input": {"x": secret}}).json()["id"]
    finished(alice, run_id)
    for response in (
        bob.get(f"/v1/runs/{run_id}"),
        bob.get(f"/v1/runs/{run_id}/events"),
        bob.post(f"/v1/runs/{run_id}/cancel"),
        bob.post(f"/v1/runs/{run_id}/approvals/t", json={"decision": "approve"}),
    ):
        body = is_problem(response, 403)
        assert secret not in str(body) and "noop" not in str(body)
    is_problem(bob.get("/v1/agents/noop"), 404)
    is_problem(bob.post("/v1/runs", json={"agentName": "noop"}), 404)
    assert bob.get("/v1/runs").json()["items"] == []
    assert bob.get("/v1/agents").json()["items"] == []


def test_approvals_and_cancel_of_a_finished_run_conflict(alice: Caller) -> None:
    alice.put("/v1/agents/noop", json=NOOP)
    run_id = alice.post("/v1/runs", json={"agentName": "noop"}).json()["id"]
    finished(alice, run_id)
    is_problem(alice.post(f"/v1/runs/{run_id}/approvals/t", json={"decision": "approve"}), 409)
    is_problem(alice.post(f"/v1/runs/{run_id}/approvals/t", json={"decision": "maybe"}), 422)
    is_problem(alice.post(f"/v1/runs/{run_id}/cancel"), 409)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_cancel_a_running_and_a_queued_run(
    database_url: str, tmp_path: Any, receiver: Receiver
) -> None:
    server = Server(
        database_url, tmp_path / "serve.log", env={"LANTERN_MAX_CONCURRENT_RUNS": "1"}
    ).start()
    try:
        alice = Caller(server, make_key(database_url, "alice", ALL_SCOPES))
        alice.put("/v1/agents/chain", json=http_chain("chain", receiver.url, 3))
        receiver.hold("/s2")
        running = alice.post("/v1/runs", json={"agentName": "chain"}).json()["id"]
        assert receiver.arrived.wait(20)
        queued = alice.post("/v1/runs", json={"agentName": "chain"}).json()["id"]
        time.sleep(0.3)
        assert alice.get(f"/v1/runs/{queued}").json()["status"] == "queued"

        response = alice.post(f"/v1/runs/{queued}/cancel")
        assert response.status_code == 202 and response.json()["status"] == "cancelled"
        response = alice.post(f"/v1/runs/{running}/cancel")
        assert response.status_code == 202 and response.json()["cancelRequested"] is True
        assert finished(alice, running)["status"] == "cancelled"
        receiver.release()
        kinds = [e["kind"] for e in alice.get(f"/v1/runs/{running}/events").json()["items"]]
        assert kinds[-1] == "run_cancelled" and "step_completed" in kinds
        assert receiver.count("/s3") == 0
        queued_kinds = [e["kind"] for e in alice.get(f"/v1/runs/{queued}/events").json()["items"]]
        assert queued_kinds == ["run_cancelled"]
    finally:
        receiver.release()
        server.stop()


def test_workers_are_listed_for_admins(api_server: Server, alice: Caller) -> None:
    admin = Caller(api_server, make_key(api_server.database_url, alice.workspace, "admin"))
    workers = admin.get("/v1/workers").json()["items"]
    me = [w for w in workers if w["id"] == f"test-{api_server.port}"]
    assert len(me) == 1 and me[0]["alive"] and me[0]["runs"] == []
    is_problem(alice.get("/v1/workers"), 403)  # every scope but admin
    metrics = alice.get("/metrics").text
    sweeps = [
        line for line in metrics.splitlines() if line.startswith("lantern_recovery_sweeps_total")
    ]
    assert sweeps and float(sweeps[0].split()[-1]) >= 1


def test_deliveries_are_listed_with_their_status(
    alice: Caller, bob: Caller, receiver: Receiver
) -> None:
    from tests.crash.test_deliver_once import deliveries_agent

    alice.put("/v1/agents/pay", json=deliveries_agent(receiver.url, gate_first=False))
    run_id = alice.post("/v1/runs", json={"agentName": "pay"}).json()["id"]
    assert finished(alice, run_id)["status"] == "succeeded"
    items = alice.get(f"/v1/runs/{run_id}/deliveries").json()["items"]
    assert [(d["name"], d["status"], d["kind"]) for d in items] == [
        ("first", "delivered", "tool"),
        ("second", "delivered", "tool"),
    ]
    assert items[0]["response"] == {"path": "/first", "received": 1}
    is_problem(bob.get(f"/v1/runs/{run_id}/deliveries"), 403)
