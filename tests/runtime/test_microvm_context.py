"""The workload's Context is lantern.Context: ctx.model and ctx.tool cross the channel to the
control plane, and a resumed workload's step names are checked against the journal."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from lantern.ids import child_run_id, idempotency_key
from tests.conftest import sqlite_url
from tests.fake_llm import FakeProvider, Script
from tests.integration.test_rate_limits import fill_window
from tests.runtime.cluster import Cluster
from tests.runtime.conftest import working
from tests.runtime.test_microvm_runs import kinds
from tests.server import make_key

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    provider = FakeProvider(script=Script(["Otters hold hands while they sleep."])).start()
    yield provider
    provider.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, fake: FakeProvider) -> Iterator[Cluster]:
    """A control plane that holds the model provider's key, and one runtime node."""
    working("sandbox")
    tmp = tmp_path_factory.mktemp("context")
    found = Cluster(sqlite_url(tmp), tmp).serve(1, **fake.env())
    found.node("n1")
    try:
        found.wait_for(
            lambda: found.ok("GET", "/v1/runtime/nodes", key=found.operator)["items"], 60
        )
        yield found
    finally:
        found.close()


def test_ctx_model_and_ctx_tool_in_a_vm_are_performed_by_the_control_plane(
    shared: Cluster, fake: FakeProvider
) -> None:
    shared.agent("asks", "jobs:asks")
    before = len(fake.requests)
    run_id = shared.start_run("asks", {"topic": "otters"})
    run = shared.finished(run_id)
    assert run["status"] == "succeeded", run
    out = run["output"]
    assert out["text"] == "Otters hold hands while they sleep."
    assert out["model"] == "gpt-4o-mini"
    assert out["usage"]["inputTokens"] == 10 and out["usage"]["outputTokens"] == 5
    assert out["looked"] == {"id": "c-7", "name": "Ada"}
    # The VM has no network: the call reached the provider from the control plane, with the
    # step's idempotency key, once.
    [sent] = fake.requests[before:]
    assert sent.key == idempotency_key(run_id, "line", 1)
    assert "Write a line about otters" in str(sent.body["messages"])
    events = shared.events(run_id)
    assert [k for k in kinds(events) if k[1] is not None] == [
        ("step_started", "line"), ("step_completed", "line"),
        ("step_started", "crm.lookup"), ("step_completed", "crm.lookup"),
    ]  # fmt: skip
    started = [e for e in events if e["kind"] == "step_started"]
    assert started[0]["data"] == {"type": "llm", "model": "gpt-4o-mini"}
    assert started[1]["data"]["type"] == "tool"
    assert run["usage"]["inputTokens"] == 10 and run["usage"]["modelCalls"] == 1


def test_a_plain_def_workload_gets_a_blocking_ctx_model(shared: Cluster) -> None:
    shared.agent("asks-plain", "jobs:asks_plain")
    run = shared.finished(shared.start_run("asks-plain", {}))
    assert run["status"] == "succeeded", run
    assert run["output"] == {"text": "Otters hold hands while they sleep."}


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


def test_waits_in_a_vm_are_journaled_as_in_process_and_resolved_by_the_control_plane(
    shared: Cluster,
) -> None:
    shared.ok("PUT", "/v1/agents/noop", json=NOOP)
    shared.agent("approves", "jobs:approves")
    run_id = shared.start_run("approves", {})

    def pending() -> bool:
        """the approval is pending"""
        items = shared.ok("GET", "/v1/approvals")["items"]
        return any(a["runId"] == run_id and a["nodeId"] == "publish" for a in items)

    shared.wait_for(pending, 60)
    assert shared.ok("GET", f"/v1/runs/{run_id}")["status"] == "running"  # the VM waits
    bob = make_key(shared.database_url, "default", "runs:approve", "bob")  # not an assignee
    decision = {"decision": "approve"}
    refused = shared.api("POST", f"/v1/runs/{run_id}/approvals/publish", key=bob, json=decision)
    assert refused.status_code == 403 and "assignees" in refused.json()["detail"], refused.text
    decided = shared.api(
        "POST", f"/v1/runs/{run_id}/approvals/publish", json={"decision": "approve"}
    )
    assert decided.status_code == 202, decided.text
    run = shared.finished(run_id)
    assert run["status"] == "succeeded", run
    child = shared.ok("GET", f"/v1/runs/{child_run_id(run_id, 'noop', 1)}")
    assert (child["status"], child["parentRunId"]) == ("succeeded", run_id)
    assert run["output"] == {"approved": True, "by": run["output"]["by"], "child": child["output"]}
    assert run["output"]["by"].startswith("key:")
    found = [(e["kind"], e["stepId"]) for e in shared.events(run_id) if e["stepId"]]
    for step in ("cool-down", "publish", "noop"):
        assert [k for k, s in found if s == step] == [
            "step_started", "step_waiting", "step_resumed", "step_completed",
        ]  # fmt: skip
    [vm] = shared.vms(run_id)
    assert (vm["state"], vm["reason"]) == ("exited", "exited")


def test_a_vm_waits_for_signals_sent_early_and_times_out_as_in_process(shared: Cluster) -> None:
    """Both signals are sent while the VM boots: kept, then taken one per wait in arrival
    order; ``never`` times out. The control plane journals it all, as for an in-process run."""
    shared.agent("signals", "jobs:awaits_signals")
    run_id = shared.start_run("signals", {})
    sent = []
    for n in (1, 2):
        answer = shared.api("POST", f"/v1/runs/{run_id}/signals/pay", json={"payload": {"n": n}})
        assert answer.status_code == 202, answer.text
        sent.append(answer.json()["id"])
    run = shared.finished(run_id)
    assert run["status"] == "succeeded", run
    assert run["output"] == {"paid": [{"n": 1}, {"n": 2}], "late": None}
    events = shared.events(run_id)
    taken = [(e["stepId"], e["data"]["signalId"]) for e in events if e["kind"] == "signal_received"]
    assert taken == [("pay", sent[0]), ("pay#2", sent[1])]
    found = [(e["kind"], e["stepId"]) for e in events if e["stepId"]]
    assert [k for k, s in found if s == "never"] == [
        "step_started", "step_waiting", "step_resumed", "step_completed",
    ]  # fmt: skip
    [timed_out] = [e for e in events if e["kind"] == "step_resumed" and e["stepId"] == "never"]
    assert timed_out["data"]["timedOut"] is True
    assert shared.api("POST", f"/v1/runs/{run_id}/signals/pay", json={}).status_code == 409


FIRST = """
import time

from lantern.workload import entrypoint


@entrypoint
async def main(ctx):
    await ctx.step("a", lambda: "A")
    await ctx.step("hold", time.sleep, 120)
    return "done"
"""

CHANGED = """
from lantern.workload import entrypoint


@entrypoint
async def main(ctx):
    await ctx.step("b", lambda: "B")
    await ctx.step("a", lambda: "A")
    return "done"
"""


def test_a_resumed_workload_asking_for_other_steps_fails_with_nondeterminism(
    tmp_path: Path,
) -> None:
    working("sandbox")
    app = tmp_path / "app"
    app.mkdir()
    (app / "changing.py").write_text(FIRST)
    cluster = Cluster(sqlite_url(tmp_path), tmp_path).serve()
    try:
        nodes = {n: cluster.node(n, app_dir=app) for n in ("n1", "n2")}
        cluster.agent("changing", "changing:main")
        run_id = cluster.start_run("changing", {})

        def holding() -> bool:
            """step hold started"""
            return ("step_started", "hold") in kinds(cluster.events(run_id))

        cluster.wait_for(holding)
        [first] = cluster.vms(run_id)
        nodes[first["nodeId"]].signal(signal.SIGKILL)
        (app / "changing.py").write_text(CHANGED)  # the code changed under the run
        run = cluster.finished(run_id)
        assert run["status"] == "failed", run
        error = run["error"]
        assert (error["code"], error["position"]) == ("nondeterminism", 1)
        assert (error["journaled"], error["requested"]) == ("a", "b")
        assert "step 1 of the journal is 'a' but the code asked for 'b'" in error["message"]
        lost, resumed = cluster.vms(run_id)
        assert (lost["reason"], resumed["resume"]) == ("node_lost", True)
        assert (resumed["state"], resumed["reason"]) == ("terminated", "nondeterminism")
        found = kinds(cluster.events(run_id))
        assert ("step_started", "b") not in found  # nothing of the changed code journaled
        assert found.count(("step_completed", "a")) == 1
        assert len(cluster.vms(run_id)) == 2  # a failed run is not resumed again
    finally:
        cluster.close()


def test_a_vm_lost_mid_sleep_is_resumed_and_keeps_the_journaled_due_time(
    tmp_path: Path,
) -> None:
    working("sandbox")
    cluster = Cluster(sqlite_url(tmp_path), tmp_path).serve()
    try:
        nodes = {n: cluster.node(n) for n in ("n1", "n2")}
        cluster.agent("naps", "jobs:naps")
        run_id = cluster.start_run("naps", {"seconds": 5})

        def napping() -> bool:
            """the timer is journaled"""
            return ("step_waiting", "nap") in kinds(cluster.events(run_id))

        cluster.wait_for(napping)
        [first] = cluster.vms(run_id)
        nodes[first["nodeId"]].signal(signal.SIGKILL)
        run = cluster.finished(run_id)
        assert run["status"] == "succeeded", run
        assert run["output"]["resumed"] is True
        lost, resumed = cluster.vms(run_id)
        assert lost["reason"] == "node_lost" and resumed["nodeId"] != lost["nodeId"]
        events = cluster.events(run_id)
        nap = [e for e in events if e["stepId"] == "nap"]
        assert [e["kind"] for e in nap] == [
            "step_started", "step_waiting", "step_resumed", "step_completed",
        ]  # fmt: skip
        due = nap[1]["data"]["dueAt"] / 1000
        assert nap[2]["data"] == {"dueAt": nap[1]["data"]["dueAt"]}
        # Woken at the due time the first VM journaled (or at once, when the resume came
        # after it), not a whole 5 s nap after the resumed VM started.
        started = [e for e in events if e["kind"] == "vm_started"][-1]
        back = datetime.fromisoformat(started["at"]).timestamp()
        assert due <= run["output"]["woke"] < max(due, back) + 3.5
    finally:
        cluster.close()


def test_a_vm_lost_while_throttled_calls_the_model_no_sooner_than_the_journaled_due_time(
    tmp_path: Path, fake: FakeProvider
) -> None:
    """The microVM side of tests/crash/test_throttle_crash.py (graph, plain and code-first
    runs): a VM whose ctx.model a rate limit holds back is SIGKILLed with its node; the run,
    resumed on the other node, makes the call once, with the attempt's key, and no sooner
    than the due time the control plane journaled before the kill."""
    working("sandbox")
    cluster = Cluster(sqlite_url(tmp_path), tmp_path).serve(1, **fake.env())
    try:
        nodes = {n: cluster.node(n) for n in ("n1", "n2")}
        limit = {"match": {"model": "openai/*"}, "tokensPerMinute": 100}
        cluster.ok("PUT", "/v1/limits/tpm", json=limit)
        asyncio.run(fill_window(cluster.database_url, "tpm", 95, leaves_in_s=9.0))
        cluster.agent("asks", "jobs:asks")
        before = len(fake.requests)
        run_id = cluster.start_run("asks", {"topic": "otters"})

        def throttled() -> bool:
            """the step's wait is journaled"""
            return ("step_throttled", "line") in kinds(cluster.events(run_id))

        cluster.wait_for(throttled, 60)
        [first] = cluster.vms(run_id)
        nodes[first["nodeId"]].signal(signal.SIGKILL)
        killed_at = time.time() * 1000
        # The window emptied at once: only the journaled due time holds the resumed call back.
        asyncio.run(fill_window(cluster.database_url, "tpm", 0, leaves_in_s=0.0))
        run = cluster.finished(run_id)
        events = cluster.events(run_id)
        vms = cluster.vms(run_id)
    finally:
        cluster.close()
    assert run["status"] == "succeeded", run
    assert run["output"]["resumed"] is True
    assert vms[0]["reason"] == "node_lost" and vms[-1]["nodeId"] != vms[0]["nodeId"]
    [sent] = fake.requests[before:]  # one call, with the attempt's key
    assert sent.key == idempotency_key(run_id, "line", 1)
    line = [e for e in events if e["stepId"] == "line"]
    # As in-process: the resumed VM's call waited out the journaled wait, not a second one.
    kinds_ = [e["kind"] for e in line]
    assert kinds_ == ["step_started", "step_throttled", "step_started", "step_completed"]
    assert {e["attempt"] for e in line} == {1}  # the wait spent no attempt
    due = line[1]["data"]["dueAt"]
    assert killed_at < due  # killed before it was due
    assert sent.at * 1000 >= due - 5, (sent.at * 1000, due)  # and the call no sooner


def test_a_call_the_control_plane_refuses_fails_the_run_saying_why(shared: Cluster) -> None:
    shared.agent("wrong", "jobs:asks_wrong")
    run_id = shared.start_run("wrong", {})
    run = shared.finished(run_id)
    assert run["status"] == "failed", run
    # Not a lost VM resumed until its attempts run out: the workload's own error, with why.
    assert run["error"]["code"] == "workload_failed", run["error"]
    message = run["error"]["message"]
    assert "CallRefused" in message and "ctx.tool('no-such-tool'): no such tool" in message
    seen = [kind for kind, _ in kinds(shared.events(run_id))]
    assert seen.count("vm_started") == 1 and "step_started" not in seen


def test_a_vm_ctx_model_waits_for_room_in_a_rate_limit(shared: Cluster, fake: FakeProvider) -> None:
    """The control plane holds a VM's ctx.model to the rate limits as any model step: while
    another replica's calls (written here through the store) keep the window full, the step
    waits (step_throttled); once they stop, it makes its one call (docs/rate-limits.md). The
    VM waits, answered with the due time: the control plane holds no request meanwhile and
    the channel is free, so a step of the workload's own beside it runs to its end first."""
    limit = {"match": {"model": "openai/*"}, "tokensPerMinute": 100}
    shared.ok("PUT", "/v1/limits/vm-tpm", json=limit)
    busy = threading.Event()
    busy.set()

    def keep_full() -> None:
        while busy.is_set():
            asyncio.run(fill_window(shared.database_url, "vm-tpm", 95, leaves_in_s=1.5))
            time.sleep(0.3)

    filler = threading.Thread(target=keep_full, daemon=True)
    filler.start()
    try:
        shared.agent("asks-beside", "jobs:asks_beside")
        before = len(fake.requests)
        run_id = shared.start_run("asks-beside", {"topic": "otters"})
        shared.wait_for(
            lambda: any(e["kind"] == "step_throttled" for e in shared.events(run_id)), 90
        )
        busy.clear()
        filler.join(10)
        run = shared.finished(run_id)
    finally:
        busy.clear()
        assert shared.api("DELETE", "/v1/limits/vm-tpm").status_code == 204
    assert run["status"] == "succeeded", run
    events = shared.events(run_id)
    throttled = [e for e in events if e["kind"] == "step_throttled"]
    assert throttled and throttled[0]["stepId"] == "line"
    assert throttled[0]["data"]["limit"] == "vm-tpm" and throttled[0]["data"]["waitMs"] > 0
    assert len(fake.requests) - before == 1  # no call while it waited
    assert {e["attempt"] for e in events if e["stepId"] == "line"} == {1}
    done = [e["stepId"] for e in events if e["kind"] == "step_completed"]
    assert done == ["tick", "line"], done
