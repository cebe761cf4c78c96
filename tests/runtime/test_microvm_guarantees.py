"""Guarantees every kind of run has, held for code-first and microVM runs on a real control
plane and a real sandbox runtime node: the sub-agent depth limit and a cancel that stops a
tree (graph runs: tests/hostile/test_limits.py, tests/hostile/test_cancel_chain.py), a cancel
that kills a microVM run's VM, and an agent's budget (graph and code-first runs:
tests/models/test_usage_and_budget.py, tests/integration/test_functions.py), and a schedule
firing runs of each kind."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from lantern import limits
from lantern.ids import child_run_id, idempotency_key
from tests.conftest import sqlite_url
from tests.fake_llm import FakeProvider, Script
from tests.runtime.cluster import Cluster
from tests.runtime.conftest import working
from tests.schedule_kinds import KINDS, check_fired, define

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
        found.wait_for(
            lambda: len(found.ok("GET", "/v1/runtime/nodes", key=found.operator)["items"]) == 2, 60
        )
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


def test_a_forged_approval_is_refused_and_the_approval_waits_for_a_person(
    shared: Cluster,
) -> None:
    shared.agent("forges", "jobs:forges")
    run_id = shared.start_run("forges", {})

    def pending() -> bool:
        """the approval is pending"""
        items = shared.ok("GET", "/v1/approvals")["items"]
        return any(a["runId"] == run_id and a["nodeId"] == "publish" for a in items)

    shared.wait_for(pending, 60)
    publish = [(e["kind"], e["data"]) for e in shared.events(run_id) if e["stepId"] == "publish"]
    assert [k for k, _ in publish] == ["step_started", "step_waiting"]
    assert publish[0][1]["type"] == "approval"
    decided = shared.api(
        "POST", f"/v1/runs/{run_id}/approvals/publish", json={"decision": "approve"}
    )
    assert decided.status_code == 202, decided.text
    run = shared.finished(run_id)
    assert run["status"] == "succeeded", run
    assert run["output"]["refused"] == [422, 422]
    assert run["output"]["approved"] is True and run["output"]["by"].startswith("key:")
    assert "alice" not in str(shared.events(run_id))


def test_an_in_vm_retry_is_journaled_with_its_due_time_and_survives_a_node_kill(
    shared: Cluster,
) -> None:
    """The same journal facts as an in-process step's retries (tests/crash/test_retry_crash.py):
    step_retrying with dueAt, each attempt its own step_started; a SIGKILL of the runtime node
    after it leaves a journal that folds, and the resumed VM serves the step from it."""
    shared.agent("flaky", "jobs:flaky_then_holds")
    run_id = shared.start_run("flaky", {})

    def holding() -> bool:
        """step hold started"""
        return any(e["stepId"] == "hold" for e in shared.events(run_id))

    shared.wait_for(holding, 60)
    [first] = shared.vms(run_id)
    [node] = [n for n in shared.nodes if n.node_id == first["nodeId"]]
    node.signal(signal.SIGKILL)
    try:
        run = shared.finished(run_id, timeout=120)
    finally:
        node.start()  # the module's later tests have both runtime nodes again
    assert run["status"] == "succeeded", run
    assert run["output"]["resumed"] is True
    assert run["output"]["flaky"] == {"attempt": 3, "key": idempotency_key(run_id, "flaky", 3)}
    flaky = [e for e in shared.events(run_id) if e["stepId"] == "flaky"]
    assert [(e["kind"], e["attempt"]) for e in flaky] == [
        ("step_started", 1), ("step_retrying", 2), ("step_started", 2), ("step_retrying", 3),
        ("step_started", 3), ("step_completed", 3),
    ]  # fmt: skip
    for retrying in (flaky[1], flaky[3]):
        data = retrying["data"]
        assert (data["of"], data["error"]["class"]) == (3, "tool")
        assert "flaked" in data["error"]["message"]
        at = datetime.fromisoformat(retrying["at"]).timestamp() * 1000
        assert data["dueAt"] >= at - 5 and data["delayMs"] >= 0
    lost, resumed = shared.vms(run_id)
    assert lost["reason"] == "node_lost" and resumed["resume"] is True


def test_a_vm_agents_anomaly_policy_fails_it_and_stops_its_vm(shared: Cluster) -> None:
    """A microVM run gets the anomaly detection of every kind of run (in-process kinds:
    tests/integration/test_anomalies.py): past maxSteps under ``fail`` it fails and its VM is
    terminated."""
    name = "vm-sprawls"
    block = {"tier": "microvm", "entrypoint": "jobs:three", "driver": "sandbox"}
    anomalies = {"excessive_steps": {"maxSteps": 2, "policy": "fail"}}
    shared.ok("PUT", f"/v1/agents/{name}", json={"name": name, "runtime": block,
                                                  "anomalies": anomalies})  # fmt: skip
    run = shared.finished(shared.start_run(name, {}))
    assert run["status"] == "failed", run
    assert (run["error"]["code"], run["error"]["kind"]) == ("anomaly_detected", "excessive_steps")
    [vm] = shared.vms(run["id"])
    assert (vm["state"], vm["reason"]) == ("terminated", "anomaly_detected")
    events = [(e["kind"], e["stepId"]) for e in shared.events(run["id"])]
    assert ("step_completed", "c") not in events and ("step_started", "c") in events, events
    assert [k for k, _ in events[-3:]] == ["anomaly_detected", "vm_terminated", "run_failed"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_schedule_starts_runs_of_every_kind(shared: Cluster, kind: str) -> None:
    """SQLite here; on PostgreSQL tests/crash/test_schedule_replicas.py fires graph, plain and
    code-first schedules, and tests/runtime/test_runtime_ha.py a microVM one."""
    name = f"every-{kind}"

    def put(path: str, body: Any) -> None:
        shared.ok("PUT", path, json=body)

    define(put, kind, name, every="1s")

    def fired() -> Any:
        """the schedule's first run finished"""
        runs = shared.ok("GET", "/v1/runs", params={"schedule": name})["items"]
        return runs and runs[-1]["status"] in ("succeeded", "failed", "cancelled")

    shared.wait_for(fired, 90, 0.2)
    assert shared.api("DELETE", f"/v1/schedules/{name}").status_code == 204  # fires no more
    listed = shared.ok("GET", "/v1/runs", params={"schedule": name})["items"]
    runs = [shared.finished(r["id"]) for r in listed]
    check_fired(shared.database_url, name, runs)
