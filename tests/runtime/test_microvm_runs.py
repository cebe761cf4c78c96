"""MicroVM runs end to end: real `lantern serve` and `lantern node` processes, real sandboxes."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import sqlite_url
from tests.runtime.cluster import Cluster
from tests.runtime.conftest import working
from tests.server import LANTERN, make_key

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One control plane and two runtime nodes for the tests that lose no node."""
    working("sandbox")
    tmp = tmp_path_factory.mktemp("cluster")
    found = Cluster(sqlite_url(tmp), tmp).serve()
    found.node("n1")
    found.node("n2")

    def registered() -> bool:
        """both runtime nodes are registered (a test may run first in its worker)"""
        return len(found.ok("GET", "/v1/runtime/nodes", key=found.operator)["items"]) == 2

    try:
        found.wait_for(registered, 60)
        yield found
    finally:
        found.close()


def kinds(events: list[dict[str, object]]) -> list[tuple[object, object]]:
    return [(e["kind"], e["stepId"]) for e in events]


def test_a_run_succeeds_in_a_vm_with_its_steps_journaled(shared: Cluster) -> None:
    shared.agent("job", "jobs:three")
    run_id = shared.start_run("job", {"hold": 0})
    run = shared.finished(run_id)
    assert run["status"] == "succeeded", run
    assert run["output"]["resumed"] is False
    events = shared.events(run_id)
    assert [k for k, _ in kinds(events)] == [
        "run_started", "vm_scheduled", "vm_started",
        "step_started", "step_completed", "step_started", "step_completed",
        "step_started", "step_completed", "vm_exited", "run_succeeded",
    ]  # fmt: skip
    [vm] = shared.vms(run_id)
    assert (vm["nodeId"], vm["driver"], vm["state"], vm["reason"], vm["exitCode"]) == (
        vm["nodeId"], "sandbox", "exited", "exited", 0,
    )  # fmt: skip
    started = next(e for e in events if e["kind"] == "vm_started")
    assert started["data"] == {
        "vmId": vm["vmId"],
        "nodeId": vm["nodeId"],
        "attempt": 1,
        "driver": "sandbox",
    }
    receipt = shared.api("GET", f"/v1/runs/{run_id}/receipt")
    assert receipt.status_code == 200


def test_the_workloads_own_failure_fails_the_run_once(shared: Cluster) -> None:
    shared.agent("bad", "jobs:fails")
    shared.agent("noimport", "no_such_module:main")
    failing = shared.start_run("bad", {})
    missing = shared.start_run("noimport", {})
    run = shared.finished(failing)
    assert run["status"] == "failed"
    assert run["error"]["code"] == "workload_failed"
    assert "the workload gave up" in run["error"]["message"]
    run = shared.finished(missing)
    assert run["status"] == "failed"
    assert run["error"]["code"] == "entrypoint_import"
    assert "no_such_module" in run["error"]["message"]
    for run_id in (failing, missing):
        assert [v["state"] for v in shared.vms(run_id)] == ["exited"]  # not resumed


def test_a_workload_writing_its_app_dir_sees_an_ordinary_error(shared: Cluster) -> None:
    shared.agent("writer", "jobs:writes_app")
    run = shared.finished(shared.start_run("writer", {}))
    assert run["status"] == "succeeded"
    assert "Read-only file system" in run["output"]["denied"]


def test_a_workload_past_its_timeout_is_killed_and_fails(shared: Cluster) -> None:
    shared.agent("slow", "jobs:forever", timeoutS=2)
    run = shared.finished(shared.start_run("slow", {}))
    assert run["status"] == "failed"
    assert (run["error"]["code"], run["error"]["class"]) == ("timeout", "timeout")
    [vm] = shared.vms(run["id"])
    assert (vm["state"], vm["reason"]) == ("terminated", "timeout")


def test_three_lost_vms_exhaust_the_run_and_no_fourth_is_placed(shared: Cluster) -> None:
    shared.agent("crashy", "jobs:crash")
    run = shared.finished(shared.start_run("crashy", {}))
    assert run["status"] == "failed"
    assert run["error"]["code"] == "microvm_resume_exhausted"
    assert run["error"]["attempts"] == 3
    vms = shared.vms(run["id"])
    assert [(v["attempt"], v["state"], v["reason"]) for v in vms] == [
        (1, "terminated", "killed"),
        (2, "terminated", "killed"),
        (3, "terminated", "killed"),
    ]
    assert [v["resume"] for v in vms] == [False, True, True]
    # A resumed VM goes to another runtime node where one is up.
    assert vms[0]["nodeId"] != vms[1]["nodeId"] and vms[1]["nodeId"] != vms[2]["nodeId"]
    # Step a completed in the first VM only: the resumed VMs were served it from the journal.
    events = shared.events(run["id"])
    assert kinds(events).count(("step_completed", "a")) == 1
    assert kinds(events).count(("step_started", "a")) == 1


def test_node_loss_mid_step_resumes_on_the_other_node(cluster: Cluster) -> None:
    nodes = {"n1": cluster.node("n1"), "n2": cluster.node("n2")}
    cluster.agent("job", "jobs:three")
    run_id = cluster.start_run("job", {"hold": 120})

    def holding_b() -> bool:
        """step b started"""
        return ("step_started", "b") in kinds(cluster.events(run_id))

    cluster.wait_for(holding_b)
    [first] = cluster.vms(run_id)
    nodes[first["nodeId"]].signal(signal.SIGKILL)
    run = cluster.finished(run_id)
    assert run["status"] == "succeeded", run
    assert run["output"]["resumed"] is True
    lost, resumed = cluster.vms(run_id)
    assert (lost["state"], lost["reason"]) == ("terminated", "node_lost")
    assert resumed["nodeId"] != lost["nodeId"] and resumed["resume"] is True
    assert (resumed["state"], resumed["reason"]) == ("exited", "exited")
    events = cluster.events(run_id)
    found = kinds(events)
    for step in ("a", "b", "c"):
        assert found.count(("step_completed", step)) == 1
    assert found.count(("step_started", "a")) == 1  # completed before the loss: not re-run
    # In flight at the loss: run again with the same attempt and key, its start journaled
    # once (as an in-process step in flight at a crash), and its output the resumed run's.
    assert found.count(("step_started", "b")) == 1
    assert run["output"]["b"] == {"slept": 0.05}
    a = next(e for e in events if e["kind"] == "step_completed" and e["stepId"] == "a")
    assert run["output"]["a"] == a["data"]["output"]  # the journaled output, served back
    terminated = next(e for e in events if e["kind"] == "vm_terminated")
    assert terminated["data"]["reason"] == "node_lost"
    assert terminated["data"]["vmId"] == lost["vmId"]
    # What an operator reads: the waterfall's VM lanes and the VMs of the run.
    env = {k: v for k, v in os.environ.items() if k not in ("LANTERN_URL", "LANTERN_API_KEY")}
    env["LANTERN_DATABASE_URL"] = cluster.database_url
    shown = subprocess.run(
        [LANTERN, "runs", "show", run_id], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "node_lost" in shown and "LANTERN_RESUME=1, 1 step(s) served from the journal" in shown
    listed = subprocess.run(
        [LANTERN, "runtime", "vms", run_id], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert lost["vmId"] in listed and resumed["vmId"] in listed and "node_lost" in listed


def test_an_agent_no_runtime_node_could_run_is_refused(shared: Cluster) -> None:
    block = {"tier": "microvm", "entrypoint": "jobs:three"}
    for extra, expected in (
        ({"driver": "qemu"}, "runtime.driver 'qemu' runs on no runtime node here"),
        ({"memoryMb": 8192}, "runtime.memoryMb 8192 is above every runtime node's memory"),
    ):
        answer = shared.api(
            "PUT", "/v1/agents/never", json={"name": "never", "runtime": {**block, **extra}}
        )
        assert answer.status_code == 422, answer.text
        assert expected in answer.json()["detail"]
        assert "sandbox" in answer.json()["detail"] or "largest" in answer.json()["detail"]
    assert shared.api("GET", "/v1/agents/never").status_code == 404  # nothing stored
    nodes = shared.ok("GET", "/v1/runtime/nodes", key=shared.operator)["items"]
    assert sorted((n["nodeId"], n["driver"], n["state"]) for n in nodes) == [
        ("n1", "sandbox", "up"),
        ("n2", "sandbox", "up"),
    ]
    assert all(n["labels"] == {"test": "1"} for n in nodes)


def test_a_plain_def_entrypoint_runs_with_a_blocking_context(shared: Cluster) -> None:
    shared.agent("plain", "jobs:plain")
    run = shared.finished(shared.start_run("plain", {"n": 21}))
    assert run["status"] == "succeeded", run
    assert run["output"] == {"doubled": 42, "run": run["id"]}


def test_the_cluster_state_answers_only_to_an_operator_key(shared: Cluster) -> None:
    """The scheduler's waiting runs and the runtime nodes span every workspace: a workspace's
    admin key gets 403; `lantern keys create --operator` makes a key that reads them and
    nothing of a workspace."""
    env = {**os.environ, "LANTERN_DATABASE_URL": shared.database_url}
    env.pop("LANTERN_URL", None)
    made = subprocess.run(
        [LANTERN, "keys", "create", "--operator", "--name", "ops"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    operator = made.stdout.strip()
    for path in ("/v1/runtime/scheduler", "/v1/runtime/nodes"):
        denied = shared.api("GET", path)  # runs:*, agents:write and admin
        assert denied.status_code == 403, denied.text
        assert "--operator" in denied.json()["detail"], denied.text
        assert shared.api("GET", path, key=operator).status_code == 200, path
    assert shared.api("GET", "/v1/runs", key=operator).status_code == 403
    refused = subprocess.run(
        [LANTERN, "keys", "create", "--scopes", "admin,operator"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode == 2 and "--operator" in refused.stderr, refused.stderr


def test_a_vm_runs_only_what_its_app_registers_for_the_run_s_workspace(shared: Cluster) -> None:
    """An entrypoint is a function the app registers (@app.agent or app.entrypoint), for the
    workspaces it names: not any importable callable a definition names. Python's and
    Lantern's own modules are refused at apply; the rest only the VM can tell (the app folder
    is the runtime node's), so the run fails there, before anything runs."""
    block = {"tier": "microvm", "entrypoint": "os:system", "driver": "sandbox"}
    answer = shared.api("PUT", "/v1/agents/sh", json={"name": "sh", "runtime": block})
    assert answer.status_code == 422, answer.text
    assert "a function the app registers" in answer.json()["detail"]
    for agent, entrypoint in (("stray", "jobs:not_registered"), ("acme-only", "jobs:acme_only")):
        shared.agent(agent, entrypoint)
        run = shared.finished(shared.start_run(agent, {}))
        assert run["status"] == "failed", run
        assert run["error"]["code"] == "entrypoint_not_registered", run
        assert "@app.agent or app.entrypoint(fn)" in run["error"]["message"], run
    acme = make_key(shared.database_url, "acme", "runs:execute,runs:read,agents:write")
    block = {"tier": "microvm", "entrypoint": "jobs:acme_only", "driver": "sandbox"}
    shared.ok("PUT", "/v1/agents/acme-only", key=acme, json={"name": "acme-only", "runtime": block})
    started = shared.ok("POST", "/v1/runs", key=acme, json={"agentName": "acme-only", "input": {}})

    def done() -> Any:
        run = shared.ok("GET", f"/v1/runs/{started['id']}", key=acme)
        return run if run["status"] in ("succeeded", "failed") else None

    run = shared.wait_for(done, 90, 0.2)
    assert (run["status"], run["output"]) == ("succeeded", "acme"), run.get("error")


def test_a_microvm_agents_concurrency_key_holds_one_run_at_a_time(shared: Cluster) -> None:
    """Flow control for the microVM kind (docs/flow-control.md), end to end: a key's second
    run starts only after its first ended, while another key's run is not held back. (The
    query this rests on, runs_needing_vm, is tested on both backends in tests/conformance/
    test_runtime_store.py; this cluster is SQLite's: one on PostgreSQL for this test alone
    would add some 11 s, its start, this run and its stop.)"""
    runtime = {"tier": "microvm", "entrypoint": "jobs:per_customer", "driver": "sandbox"}
    definition = {
        "name": "vm-per-customer",
        "runtime": runtime,
        "concurrency": {"key": "{{ input.customer }}", "limit": 1},
    }
    shared.ok("PUT", "/v1/agents/vm-per-customer", json=definition)
    ids = [
        shared.start_run("vm-per-customer", {"customer": c, "hold": 0.5})
        for c in ("acme", "acme", "bolt")
    ]
    runs = [shared.finished(i) for i in ids]
    assert [r["status"] for r in runs] == ["succeeded"] * 3, runs
    assert [r["concurrencyKey"] for r in runs] == ["acme", "acme", "bolt"]
    first, second, other = (shared.events(i) for i in ids)
    assert min(e["at"] for e in second) > max(e["at"] for e in first), "acme ran twice at once"
    assert min(e["at"] for e in other) < max(e["at"] for e in first), "bolt waited for acme"
