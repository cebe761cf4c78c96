"""Scheduler HA and stale VMs: the leader replica SIGKILLed (then a microVM agent's schedule
fired by the survivor), a lost runtime node coming back."""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from lantern.runtime.relay import digest, new_token
from lantern.store import open_store
from lantern.store.runtime import SCHEDULER, Vm
from tests.conftest import sqlite_url
from tests.runtime.cluster import Cluster
from tests.runtime.conftest import working
from tests.runtime.test_microvm_runs import kinds
from tests.schedule_kinds import check_fired, define

pytestmark = pytest.mark.timeout(240)


def test_the_leader_killed_another_replica_leads_with_a_higher_epoch(
    pg_url: str, tmp_path: Path
) -> None:
    working("sandbox")
    cluster = Cluster(pg_url, tmp_path).serve(2)
    try:

        def leading() -> dict[str, object] | None:
            """a replica leads"""
            found = cluster.ok("GET", "/v1/runtime/scheduler", key=cluster.operator)
            return found if found["leader"] else None

        status = cluster.wait_for(leading, 30)
        ids = [f"test-{s.port}" for s in cluster.servers]
        leader = ids.index(status["leader"])
        other = 1 - leader
        cluster.node("n1", server=other)  # relays to the replica that survives
        cluster.agent("job", "jobs:three")
        run_id = cluster.start_run("job", {"hold": 4})
        cluster.wait_for(lambda: ("step_started", "b") in kinds(cluster.events(run_id)))
        cluster.servers[leader].kill()
        killed = time.monotonic()

        def new_leader() -> dict[str, object] | None:
            """another replica leads"""
            found = cluster.ok("GET", "/v1/runtime/scheduler", key=cluster.operator, server=other)
            return found if found["leader"] == ids[other] else None

        took = cluster.wait_for(new_leader, 30)
        elapsed = time.monotonic() - killed
        assert took["epoch"] > status["epoch"]
        assert elapsed < 2 + 3  # LANTERN_NODE_TTL (the lease's TTL) and a tick or two
        run = cluster.ok("GET", f"/v1/runs/{run_id}", server=other)
        deadline = time.monotonic() + 60
        while run["status"] not in ("succeeded", "failed") and time.monotonic() < deadline:
            time.sleep(0.2)
            run = cluster.ok("GET", f"/v1/runs/{run_id}", server=other)
        assert run["status"] == "succeeded", run
        # The VM outlived the failover: the new leader placed no second one.
        vms = cluster.ok("GET", f"/v1/runs/{run_id}/vms", server=other)["items"]
        assert [(v["state"], v["reason"]) for v in vms] == [("exited", "exited")]
        # The survivor fires a microVM agent's schedule, on PostgreSQL (every kind, SQLite:
        # tests/runtime/test_microvm_guarantees.py).
        fires_a_microvm_schedule(cluster, other)
    finally:
        cluster.close()


def fires_a_microvm_schedule(cluster: Cluster, server: int) -> None:
    def put(path: str, body: object) -> None:
        assert cluster.api("PUT", path, server=server, json=body).status_code == 200

    define(put, "microvm", "every-vm", every="1s")

    def fired() -> object:
        """the schedule's first run finished"""
        runs = cluster.ok("GET", "/v1/runs", server=server, params={"schedule": "every-vm"})
        return runs["items"] and runs["items"][-1]["status"] in ("succeeded", "failed")

    cluster.wait_for(fired, 60, 0.2)
    assert cluster.api("DELETE", "/v1/schedules/every-vm", server=server).status_code == 204
    listed = cluster.ok("GET", "/v1/runs", server=server, params={"schedule": "every-vm"})
    runs = [
        cluster.ok("GET", f"/v1/runs/{r['id']}", server=server, params={"wait": 30})
        for r in listed["items"]
    ]
    check_fired(cluster.database_url, "every-vm", runs)


def test_a_lost_node_that_comes_back_has_its_stale_vm_stopped(tmp_path: Path) -> None:
    working("sandbox")
    cluster = Cluster(sqlite_url(tmp_path), tmp_path).serve()
    try:
        nodes = {"n1": cluster.node("n1"), "n2": cluster.node("n2")}
        cluster.agent("job", "jobs:three")
        run_id = cluster.start_run("job", {"hold": 8})
        cluster.wait_for(lambda: ("step_started", "b") in kinds(cluster.events(run_id)))
        [first] = cluster.vms(run_id)
        frozen = nodes[first["nodeId"]]
        frozen.signal(signal.SIGSTOP)  # its VM sleeps on in step b
        try:
            run = cluster.finished(run_id)
        finally:
            frozen.signal(signal.SIGCONT)
        assert run["status"] == "succeeded"
        lost, resumed = cluster.vms(run_id)
        assert (lost["state"], lost["reason"]) == ("terminated", "node_lost")
        assert resumed["nodeId"] != frozen.node_id

        def stopped() -> bool:
            """the node that came back stops its stale VM"""
            return "stopping it" in frozen.log.read_text() or "refused" in frozen.log.read_text()

        cluster.wait_for(stopped, 30)
        time.sleep(1)
        events = cluster.events(run_id)
        assert kinds(events).count(("step_completed", "b")) == 1
        assert events[-1]["kind"] == "run_succeeded"  # nothing from the stale VM after it
    finally:
        cluster.close()


def test_reports_under_a_wrong_or_stale_token_write_nothing(tmp_path: Path) -> None:
    cluster = Cluster(sqlite_url(tmp_path), tmp_path).serve()
    try:
        cluster.agent("job", "jobs:three")
        run_id = cluster.start_run("job", {})
        token = new_token("vm_stale", "s3cret")

        async def plant() -> None:
            store = open_store(cluster.database_url)
            await store.open()
            try:
                leader = await store.acquire_named_lease(SCHEDULER, "test", 60)
                if leader is None:  # the replica leads: wait for it to let the test in
                    current = await store.get_named_lease(SCHEDULER)
                    assert current is not None
                    leader = current
                vm = Vm("vm_stale", run_id, "nX", "sandbox", 1, "scheduled", 128, datetime.now(UTC))
                assert await store.place_vm(leader, vm)
                assert await store.take_vm("vm_stale", "nX", digest(token), 1)
                assert await store.end_vm("vm_stale", "terminated", "node_lost", None)
            finally:
                await store.close()

        cluster.wait_for(lambda: cluster.events(run_id))  # run_started: it waits for a node
        waiting = cluster.ok("GET", "/v1/runtime/scheduler", key=cluster.operator)["waiting"]
        assert {"runId": run_id, "reason": "no runtime node is up"} in waiting
        report = {"events": [{"kind": "step_started", "stepId": "a", "attempt": 1}]}
        url = cluster.servers[0].url + "/v1/runtime/report"
        none = httpx.post(url, json=report)
        wrong = httpx.post(url, json=report, headers={"Authorization": "Bearer lvm.vm_x.nope"})
        assert (none.status_code, wrong.status_code) == (401, 401)
        assert none.headers["content-type"].startswith("application/problem+json")
        asyncio.run(plant())
        stale = httpx.post(url, json=report, headers={"Authorization": f"Bearer {token}"})
        assert stale.status_code == 409, stale.text
        assert [e["kind"] for e in cluster.events(run_id)] == ["run_started"]
    finally:
        cluster.close()
