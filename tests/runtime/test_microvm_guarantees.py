"""Guarantees every kind of run has, held for code-first and microVM runs on a real control
plane and a real sandbox runtime node: the sub-agent depth limit and a cancel that stops a
tree (graph runs: tests/hostile/test_limits.py, tests/hostile/test_cancel_chain.py), a cancel
that kills a microVM run's VM, and an agent's budget (graph and code-first runs:
tests/models/test_usage_and_budget.py, tests/integration/test_functions.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lantern import limits
from lantern.ids import child_run_id
from tests.conftest import sqlite_url
from tests.fake_llm import FakeProvider, Script
from tests.runtime.cluster import Cluster
from tests.runtime.conftest import working

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    provider = FakeProvider(script=Script(["Otters hold hands while they sleep."])).start()
    yield provider
    provider.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, fake: FakeProvider) -> Iterator[Cluster]:
    """A control plane with a self-calling code agent, and two runtime nodes roomy enough for
    a whole chain of VMs each waiting on its child."""
    working("sandbox")
    tmp = tmp_path_factory.mktemp("guarantees")
    found = Cluster(sqlite_url(tmp), tmp).serve(1, app="tests.runtime.guard_app:app", **fake.env())
    for node in ("n1", "n2"):
        found.node(node, capacity=12)
    try:
        found.wait_for(lambda: len(found.ok("GET", "/v1/runtime/nodes")["items"]) == 2, 60)
        yield found
    finally:
        found.close()


def chain_of(cluster: Cluster, root: str, step: str) -> list[dict[str, Any]]:
    """The root run and each run its step ``step`` started, down the chain."""
    runs = [cluster.ok("GET", f"/v1/runs/{root}")]
    while True:
        child = cluster.api("GET", f"/v1/runs/{child_run_id(runs[-1]['id'], step, 1)}")
        if child.status_code == 404:
            return runs
        runs.append(child.json())


def stops_at_the_limit(cluster: Cluster, agent: str, step: str) -> None:
    root = cluster.start_run(agent, {})
    run = cluster.finished(root, timeout=180)
    assert run["status"] == "failed", run
    runs = chain_of(cluster, root, step)
    assert len(runs) == limits.MAX_SUBAGENT_DEPTH + 1, [r["id"] for r in runs]
    deepest = cluster.finished(runs[-1]["id"])
    assert deepest["status"] == "failed", deepest
    assert f"the limit of {limits.MAX_SUBAGENT_DEPTH}" in deepest["error"]["message"]


def test_a_code_agent_that_calls_itself_stops_at_the_depth_limit(shared: Cluster) -> None:
    stops_at_the_limit(shared, "chain", "chain")


def test_a_vm_agent_that_calls_itself_stops_at_the_depth_limit(shared: Cluster) -> None:
    shared.agent("vm-chain", "jobs:calls_itself", memoryMb=256)
    stops_at_the_limit(shared, "vm-chain", "vm-chain")


def test_a_cancel_of_the_root_stops_the_whole_tree(shared: Cluster) -> None:
    root = shared.start_run("chain", {"pause": 0.5})

    def grown() -> bool:
        """the chain is three runs deep"""
        return len(chain_of(shared, root, "chain")) >= 3

    shared.wait_for(grown, 60)
    assert shared.api("POST", f"/v1/runs/{root}/cancel").status_code == 202
    before = chain_of(shared, root, "chain")
    for run in before:
        assert shared.finished(run["id"], timeout=30)["status"] == "cancelled", run["id"]
    time.sleep(1.5)  # a pause and more: a run that escaped the cancel would have a child by now
    after = chain_of(shared, root, "chain")
    assert len(after) <= len(before) + 1, [r["id"] for r in after]
    assert all(r["status"] == "cancelled" for r in after), [(r["id"], r["status"]) for r in after]


def cancelled_within_two_seconds(cluster: Cluster, run_id: str) -> list[dict[str, Any]]:
    started = time.monotonic()
    assert cluster.api("POST", f"/v1/runs/{run_id}/cancel").status_code == 202
    run = cluster.finished(run_id, timeout=10)
    assert run["status"] == "cancelled", run
    assert time.monotonic() - started < 2.0
    [vm] = cluster.vms(run_id)
    assert (vm["state"], vm["reason"]) == ("terminated", "cancelled")
    events = cluster.events(run_id)
    assert [e["kind"] for e in events[-2:]] == ["vm_terminated", "run_cancelled"]
    assert events[-2]["data"]["reason"] == "cancelled"
    return events


def test_a_cancel_kills_a_vm_waiting_at_an_approval(shared: Cluster) -> None:
    shared.agent("approves", "jobs:approves")
    run_id = shared.start_run("approves", {})

    def pending() -> bool:
        """the approval is pending"""
        items = shared.ok("GET", "/v1/approvals")["items"]
        return any(a["runId"] == run_id and a["nodeId"] == "publish" for a in items)

    shared.wait_for(pending, 60)
    cancelled_within_two_seconds(shared, run_id)
    decided = shared.api(
        "POST", f"/v1/runs/{run_id}/approvals/publish", json={"decision": "approve"}
    )
    assert decided.status_code == 409, decided.text
    time.sleep(1.5)  # a VM still alive would have journaled its next step by now
    assert shared.ok("GET", f"/v1/runs/{run_id}")["status"] == "cancelled"
    assert shared.events(run_id)[-1]["kind"] == "run_cancelled"


def test_a_cancel_kills_a_vm_running_a_long_step(shared: Cluster) -> None:
    shared.agent("holds", "jobs:holds")
    run_id = shared.start_run("holds", {})

    def holding() -> bool:
        """step hold started"""
        return any(e["stepId"] == "hold" for e in shared.events(run_id))

    shared.wait_for(holding, 60)
    [vm] = shared.vms(run_id)
    assert processes_of(vm["vmId"])  # its sandbox runs the step
    cancelled_within_two_seconds(shared, run_id)
    shared.wait_for(lambda: not processes_of(vm["vmId"]), 5)  # and is gone


def processes_of(vm_id: str) -> list[int]:
    """The host's processes whose command line names the VM (its bubblewrap sandbox)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if vm_id.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue  # it ended meanwhile
    return found


def test_a_vm_agents_budget_stops_its_model_calls(shared: Cluster, fake: FakeProvider) -> None:
    name = "vm-spends"
    block = {"tier": "microvm", "entrypoint": "jobs:spends", "driver": "sandbox"}
    definition = {"name": name, "runtime": block, "budget": {"maxTokens": 10}}
    shared.ok("PUT", f"/v1/agents/{name}", json=definition)
    before = len(fake.requests)
    run = shared.finished(shared.start_run(name, {}))
    assert run["status"] == "failed", run
    assert run["error"]["code"] == "budget_exceeded", run["error"]
    assert "maxTokens 10" in run["error"]["message"]
    assert len(fake.requests) - before <= 1  # the call past the budget was never made
    assert run["usage"]["inputTokens"] + run["usage"]["outputTokens"] <= 15
