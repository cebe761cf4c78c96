"""Parked runs and sub-agents across SIGKILLs of real `lantern serve` processes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from lantern.ids import child_run_id
from lantern.store import open_store
from tests.server import ALL_SCOPES, Server, make_key

GATE = {
    "name": "gate",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "ok", "type": "approval", "data": {"prompt": "Ship {{ input.item }}?"}},
            {
                "id": "ship",
                "type": "tool",
                "data": {"tool": "noop", "args": {"item": "{{ input.item }}"}},
            },
        ],
        "edges": [{"source": "start", "target": "ok"}, {"source": "ok", "target": "ship"}],
    },
}


def wait_status(api: httpx.Client, run_id: str, status: str, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = api.get(f"/v1/runs/{run_id}").json()
        if run["status"] == status:
            return dict(run)
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} is {run['status']}, not {status}")


def live_leases(database_url: str) -> set[str]:
    async def read() -> set[str]:
        store = open_store(database_url)
        await store.open()
        try:
            return {r for w in await store.list_workers() for r in w.runs}
        finally:
            await store.close()

    return asyncio.run(read())


def test_a_parked_run_survives_two_sigkills_and_resumes_on_the_replica_that_approved_it(
    database_url: str, tmp_path: Path
) -> None:
    key = make_key(database_url, "default", ALL_SCOPES)
    headers = {"Authorization": f"Bearer {key}"}
    log = tmp_path / "serve.log"
    first = Server(database_url, log, env={"LANTERN_WORKER_ID": "replica-a"}).start()
    with httpx.Client(base_url=first.url, headers=headers, timeout=30) as api:
        api.put("/v1/agents/gate", json=GATE).raise_for_status()
        run_id = api.post("/v1/runs", json={"agentName": "gate", "input": {"item": "tea"}}).json()[
            "id"
        ]
        wait_status(api, run_id, "waiting")
    assert run_id not in live_leases(database_url)
    first.kill()
    for _ in range(2):  # two SIGKILL/restart cycles: it stays parked, nobody holds it
        again = Server(database_url, log, env={"LANTERN_WORKER_ID": "replica-a"}).start()
        with httpx.Client(base_url=again.url, headers=headers, timeout=30) as api:
            assert api.get(f"/v1/runs/{run_id}").json()["status"] == "waiting"
        assert run_id not in live_leases(database_url)
        again.kill()

    other = Server(database_url, log, env={"LANTERN_WORKER_ID": "replica-b"}).start()
    try:
        with httpx.Client(base_url=other.url, headers=headers, timeout=30) as api:
            decided = api.post(
                f"/v1/runs/{run_id}/approvals/ok", json={"decision": "approve", "comment": "go"}
            )
            assert decided.status_code == 202, decided.text
            twice = api.post(f"/v1/runs/{run_id}/approvals/ok", json={"decision": "reject"})
            assert twice.status_code == 409
            assert twice.headers["content-type"].startswith("application/problem+json")
            run = wait_status(api, run_id, "succeeded")
            events = api.get(f"/v1/runs/{run_id}/events").json()["items"]
    finally:
        other.stop()
    assert run["output"] == {"item": "tea"}
    resumed = [e["data"] for e in events if e["kind"] == "run_resumed"]
    assert resumed == [{"worker": "replica-b"}]
    assert not [e for e in events if e["kind"] == "run_recovered"]
    step_resumed = next(e for e in events if e["kind"] == "step_resumed")
    assert step_resumed["data"]["decision"] == "approved"
    assert step_resumed["data"]["by"].startswith("key:")


def test_killed_right_after_the_child_was_created_there_is_one_child(
    database_url: str, tmp_path: Path
) -> None:
    key = make_key(database_url, "default", ALL_SCOPES)
    headers = {"Authorization": f"Bearer {key}"}
    log = tmp_path / "serve.log"
    child = {
        "name": "child",
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {
                    "id": "inner",
                    "type": "tool",
                    "data": {"tool": "noop", "args": {"got": "{{ input.n }}"}},
                },
            ],
            "edges": [{"source": "start", "target": "inner"}],
        },
    }
    parent = {
        "name": "parent",
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {
                    "id": "kid",
                    "type": "subagent",
                    "data": {"agentName": "child", "input": {"n": "{{ input.n }}"}},
                },
            ],
            "edges": [{"source": "start", "target": "kid"}],
        },
    }
    env = {"LANTERN_WORKER_ID": "sub-1"}
    # The child's first step starting means the child exists; the parent may or may not have
    # journaled its wait yet. Either way the re-drive must find that child, not make another.
    crashing = Server(
        database_url, log, env={**env, "LANTERN_TEST_CRASH_AFTER": "step_started:inner"}
    ).start()
    with httpx.Client(base_url=crashing.url, headers=headers, timeout=30) as api:
        api.put("/v1/agents/child", json=child).raise_for_status()
        api.put("/v1/agents/parent", json=parent).raise_for_status()
        run_id = api.post("/v1/runs", json={"agentName": "parent", "input": {"n": 7}}).json()["id"]
    assert crashing.proc is not None and crashing.proc.wait(20) == -9

    second = Server(database_url, log, env=env).start()
    try:
        with httpx.Client(base_url=second.url, headers=headers, timeout=30) as api:
            run = wait_status(api, run_id, "succeeded")
            children = api.get("/v1/runs", params={"agentName": "child"}).json()["items"]
    finally:
        second.stop()
    assert [c["id"] for c in children] == [child_run_id(run_id, "kid", 1)]
    assert run["children"] == [children[0]["id"]]
    assert children[0]["parentRunId"] == run_id
    assert run["output"] == {"got": 7}
