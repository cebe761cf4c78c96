"""Placement is fair between workspaces: one tenant's queue does not hold every slot.

Only microVM runs take a runtime node's slots; graph, plain and code-first runs are driven by
the server (LANTERN_MAX_CONCURRENT_RUNS, LANTERN_MAX_QUEUED_RUNS: tests/hostile/test_limits.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from lantern.runtime.scheduler import fair_order
from tests.runtime.cluster import Cluster
from tests.server import make_key

pytestmark = pytest.mark.timeout(120)


def test_fair_order_takes_one_run_of_each_workspace_in_turn() -> None:
    waiting = [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b"), ("c1", "c"), ("b2", "b")]
    assert [r for r, _ in fair_order(waiting)] == ["a1", "b1", "c1", "a2", "b2", "a3"]


def test_a_second_workspaces_one_run_is_placed_while_the_first_has_many_queued(
    cluster: Cluster,
) -> None:
    """And no VM may ask to live longer than the operator allows (LANTERN_VM_MAX_TIMEOUT)."""
    block = {"tier": "microvm", "entrypoint": "jobs:three", "timeoutS": 86400}
    refused = cluster.api("PUT", "/v1/agents/long", json={"name": "long", "runtime": block})
    assert refused.status_code == 422, refused.text
    assert "LANTERN_VM_MAX_TIMEOUT (3600 s)" in refused.text
    assert cluster.api("GET", "/v1/agents/long").status_code == 404  # nothing applied
    other = make_key(cluster.database_url, "other", "runs:execute,runs:read,agents:write")

    def as_other(method: str, path: str, **kw: Any) -> Any:
        url = cluster.servers[0].url + path
        response = httpx.request(
            method, url, headers={"Authorization": f"Bearer {other}"}, timeout=30, **kw
        )
        assert response.status_code < 300, response.text
        return response.json()

    cluster.agent("job", "jobs:three")
    block = {"tier": "microvm", "entrypoint": "jobs:three", "driver": "sandbox"}
    as_other("PUT", "/v1/agents/job", json={"name": "job", "runtime": block})
    # The first workspace queues six long runs before the second's one, all before any
    # runtime node is up: oldest first would give the first workspace both slots.
    many = [cluster.start_run("job", {"hold": 30}) for _ in range(6)]
    one = as_other("POST", "/v1/runs", json={"agentName": "job", "input": {"hold": 0}})["id"]
    cluster.node("n1", capacity=2)

    def done() -> Any:
        """the second workspace's run finished"""
        run = as_other("GET", f"/v1/runs/{one}")
        return run if run["status"] in ("succeeded", "failed") else None

    assert cluster.wait_for(done, 60)["status"] == "succeeded"
    # Meanwhile the first workspace held one slot, its other runs waiting their turn.
    placed = [r for r in many if cluster.vms(r)]
    assert len(placed) <= 2, placed
    for run_id in many:
        cluster.ok("POST", f"/v1/runs/{run_id}/cancel")
