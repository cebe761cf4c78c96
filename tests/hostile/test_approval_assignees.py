"""An approval's assignees decide it: a key with a name not among them gets 403 and changes
nothing, for a graph's approval node and a code-first agent's ctx.approval alike (a microVM
workload's: tests/runtime/test_microvm_context.py). A key without a name is not checked."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.hostile.kit import Tenant
from tests.server import Server, make_key

GRAPH = {
    "name": "ship-graph",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "ship", "type": "approval", "data": {"prompt": "Ship?", "assignees": ["alice"]}},
        ],
        "edges": [{"source": "start", "target": "ship"}],
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp("assignees")
    s = Server(
        f"sqlite:///{tmp / 'lantern.db'}", tmp / "serve.log", app="tests.hostile.approvals_app:app"
    ).start()
    yield s
    s.stop()


def approve(server: Server, name: str | None, run_id: str) -> httpx.Response:
    key = make_key(server.database_url, "default", "runs:approve", name)
    return httpx.post(
        f"{server.url}/v1/runs/{run_id}/approvals/ship",
        json={"decision": "approve"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


@pytest.mark.parametrize("kind", ["graph", "code-first"])
def test_a_named_key_not_among_the_assignees_cannot_decide(server: Server, kind: str) -> None:
    owner = Tenant(server, "default", "runs:execute,runs:read,agents:write")
    try:
        agent = "signoff"
        if kind == "graph":
            assert owner.apply(GRAPH).status_code in (200, 201)
            agent = "ship-graph"
        run_id = owner.start(agent)
        deadline = time.monotonic() + 30
        while run_id not in [a["runId"] for a in owner.http.get("/v1/approvals").json()["items"]]:
            assert time.monotonic() < deadline, "the approval is never pending"
            time.sleep(0.05)
        refused = approve(server, "bob", run_id)
        assert refused.status_code == 403, refused.text
        assert "'bob' is not among the assignees" in refused.json()["detail"]
        assert [e for e in owner.events(run_id) if e["kind"] == "step_resumed"] == []
        assert approve(server, "alice", run_id).status_code == 202
        run = owner.finished(run_id)
        assert run["status"] == "succeeded", run
        [resumed] = [e for e in owner.events(run_id) if e["kind"] == "step_resumed"]
        assert resumed["data"]["decision"] == "approved", resumed
    finally:
        owner.close()
