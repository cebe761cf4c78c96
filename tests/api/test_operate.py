"""Operating runs over the API: the pending-approvals view, the approver's identity in the
journal, and the calling key's own description (both backends, a real server)."""

from __future__ import annotations

import copy
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import sqlite_url
from tests.helpers import wait_until
from tests.server import Server, make_key

REVIEW: dict[str, Any] = {
    "name": "review",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "ok", "type": "approval", "data": {"prompt": "Refund {{ input.who }}?"}},
            {
                "id": "send",
                "type": "tool",
                "data": {
                    "tool": "noop",
                    "args": {
                        "how": "{{ steps.ok.output.decision }}",
                        "by": "{{ steps.ok.output.approver.keyName }}",
                    },
                },
            },
        ],
        "edges": [{"source": "start", "target": "ok"}, {"source": "ok", "target": "send"}],
    },
}


def client(server: Server, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def parked(api: httpx.Client, who: str) -> str:
    run_id: str = api.post("/v1/runs", json={"agentName": "review", "input": {"who": who}}).json()[
        "id"
    ]
    wait_until(lambda: api.get(f"/v1/runs/{run_id}").json()["status"] == "waiting")
    return run_id


@pytest.fixture
def api_server(module_server: Server) -> Server:
    """The module's server (both backends): each test's keys are in workspaces of their own."""
    return module_server


def workspace(name: str) -> str:
    return f"{name}-{secrets.token_hex(4)}"


def test_pending_approvals_and_who_decided(api_server: Server) -> None:
    db, acme = api_server.database_url, workspace("acme")
    admin = make_key(db, acme, "runs:execute,runs:read,agents:write", name="deployer")
    approver = make_key(db, acme, "runs:approve,runs:read", name="alice")
    reader = make_key(db, acme, "runs:read")
    stranger = make_key(db, workspace("other"), "runs:read,runs:approve")
    with (
        client(api_server, admin) as api,
        client(api_server, approver) as alice,
        client(api_server, reader) as ro,
        client(api_server, stranger) as other,
    ):
        api.put("/v1/agents/review", json=REVIEW).raise_for_status()
        first, second = parked(api, "Ada"), parked(api, "Bob")

        pending = ro.get("/v1/approvals", params={"status": "pending"})
        assert pending.status_code == 200, pending.text
        items = pending.json()["items"]
        assert [(p["runId"], p["nodeId"], p["prompt"]) for p in items] == [
            (first, "ok", "Refund Ada?"),
            (second, "ok", "Refund Bob?"),
        ]
        assert all(p["agentName"] == "review" and p["since"] for p in items)
        assert other.get("/v1/approvals").json()["items"] == []  # another workspace's runs
        scraped = httpx.get(f"{api_server.url}/metrics", timeout=30).text
        assert f'lantern_runs{{status="waiting",workspace="{acme}"}} 2.0' in scraped, scraped
        assert "lantern_leases_held 0.0" in scraped  # parked runs hold no lease
        assert "lantern_oldest_queued_run_age_seconds 0.0" in scraped
        bad = ro.get("/v1/approvals", params={"status": "decided"})
        assert bad.status_code == 422 and bad.headers["content-type"].startswith(
            "application/problem+json"
        )

        made = alice.post(
            f"/v1/runs/{first}/approvals/ok", json={"decision": "approve", "comment": "fine"}
        )
        assert made.status_code == 202, made.text
        assert made.json()["decidedByName"] == "alice"
        assert [p["runId"] for p in ro.get("/v1/approvals").json()["items"]] == [second]

        run = api.get(f"/v1/runs/{first}", params={"wait": 30}).json()
        assert run["status"] == "succeeded", run
        assert run["output"] == {"how": "approved", "by": "alice"}
        events: list[dict[str, Any]] = api.get(f"/v1/runs/{first}/events").json()["items"]
        resumed = next(e for e in events if e["kind"] == "step_resumed")
        key_id = alice.get("/v1/keys/self").json()["id"]
        assert resumed["data"]["approver"] == {"keyId": key_id, "keyName": "alice"}
        assert resumed["data"]["comment"] == "fine"

        # a decision from another workspace changes nothing
        refused = other.post(f"/v1/runs/{second}/approvals/ok", json={"decision": "approve"})
        assert refused.status_code == 403
        assert [p["runId"] for p in ro.get("/v1/approvals").json()["items"]] == [second]


def test_keys_self_describes_the_calling_key(api_server: Server) -> None:
    acme = workspace("acme")
    key = make_key(api_server.database_url, acme, "runs:read,runs:approve", name="ops bot")
    with client(api_server, key) as api:
        me = api.get("/v1/keys/self").json()
        assert me["name"] == "ops bot" and me["workspace"] == acme
        assert me["scopes"] == ["runs:approve", "runs:read"] and key.startswith(f"lk_{me['id']}_")
        assert "secret" not in str(me).lower() and key not in str(me)
    with client(api_server, "lk_nope_nope") as api:
        assert api.get("/v1/keys/self").status_code == 401


def test_apply_refuses_a_tool_the_serving_app_lacks(api_server: Server) -> None:
    key = make_key(api_server.database_url, workspace("acme"), "agents:write,agents:read")
    bad = copy.deepcopy(REVIEW)
    bad["graph"]["nodes"][2]["data"]["tool"] = "crm.lookpu"  # crash_app has crm.lookup
    bad["graph"]["nodes"][1]["data"]["prompt"] = "{{ steps.send.output }}"
    with client(api_server, key) as api:
        refused = api.put("/v1/agents/review", json=bad)
        assert refused.status_code == 422, refused.text
        assert refused.json()["errors"] == [
            "node 'ok': a template reads steps.send, but 'send' is not one of its"
            " ancestors, so it may not have run yet",
            "node 'send': tool 'crm.lookpu' is not registered by the app",
        ]
        assert api.get("/v1/agents/review").status_code == 404
        assert api.put("/v1/agents/review", json=REVIEW).status_code == 200


def test_a_code_agents_approval_journals_who_decided(tmp_path: Path) -> None:
    """ctx.approval keeps the approver as a graph's approval node does: the key's id and name
    in step_resumed, which the waterfall shows."""
    server = Server(sqlite_url(tmp_path), tmp_path / "serve.log", app="tests.crash.code_app:app")
    server.start()
    try:
        db = server.database_url
        admin = make_key(db, "acme", "runs:execute,runs:read")
        approver = make_key(db, "acme", "runs:approve,runs:read", name="alice")
        with client(server, admin) as api, client(server, approver) as alice:
            made = api.post("/v1/runs", json={"agentName": "publisher", "input": {"text": "hi"}})
            run_id = made.json()["id"]
            wait_until(lambda: api.get(f"/v1/runs/{run_id}").json()["status"] == "waiting")
            decided = alice.post(
                f"/v1/runs/{run_id}/approvals/publish", json={"decision": "approve"}
            )
            assert decided.status_code == 202, decided.text
            run = api.get(f"/v1/runs/{run_id}", params={"wait": 30}).json()
            assert run["status"] == "succeeded", run
            events: list[dict[str, Any]] = api.get(f"/v1/runs/{run_id}/events").json()["items"]
            key_id = alice.get("/v1/keys/self").json()["id"]
        resumed = next(e for e in events if e["kind"] == "step_resumed")
        assert resumed["data"]["approver"] == {"keyId": key_id, "keyName": "alice"}
        assert run["output"] == {"draft": "HI", "approved": True, "by": f"key:{key_id}"}
    finally:
        server.stop()
