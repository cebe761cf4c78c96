"""Code-first agents survive a SIGKILL of the real server: replay, parking, children, changes."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from lantern.demo.receiver import Receiver
from lantern.ids import child_run_id
from tests.helpers import wait_until
from tests.server import ALL_SCOPES, Server, make_key

APP = "tests.crash.code_app:app"


class Replicas:
    """``lantern serve`` processes on one database with the code app loaded, and an API key
    for them. Whatever a test leaves running (it failed half-way) is killed, not leaked."""

    def __init__(self, database_url: str, tmp_path: Path) -> None:
        self.database_url = database_url
        self.tmp_path = tmp_path
        self.key = make_key(database_url, "default", ALL_SCOPES)
        self.started: list[Server] = []

    def serve(self, worker: str, **env: str) -> Server:
        env = {"LANTERN_WORKER_ID": worker, **env}
        server = Server(self.database_url, self.tmp_path / f"{worker}.log", env=env, app=APP)
        self.started.append(server)
        return server.start()

    @contextmanager
    def api(self, server: Server, key: str | None = None) -> Iterator[httpx.Client]:
        headers = {"Authorization": f"Bearer {key or self.key}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as api:
            yield api

    def stop_all(self) -> None:
        for server in self.started:
            if server.proc is None or server.proc.poll() is not None:
                continue
            try:
                server.stop()
            except subprocess.TimeoutExpired:
                server.kill()


@pytest.fixture
def replicas(database_url: str, tmp_path: Path) -> Iterator[Replicas]:
    r = Replicas(database_url, tmp_path)
    yield r
    r.stop_all()


def start(api: httpx.Client, agent: str, input: Any) -> str:
    created = api.post("/v1/runs", json={"agentName": agent, "input": input})
    assert created.status_code == 202, created.text
    return str(created.json()["id"])


def finished(api: httpx.Client, run_id: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        run: dict[str, Any] = api.get(f"/v1/runs/{run_id}", params={"wait": 10}).json()
        if run["status"] in ("succeeded", "failed", "cancelled") or time.monotonic() > deadline:
            return run


def test_sigkill_mid_http_step_reruns_only_that_step_with_its_key(
    replicas: Replicas, receiver: Receiver
) -> None:
    first = replicas.serve("code-1")
    with replicas.api(first) as api:
        listed = {a["name"]: a for a in api.get("/v1/agents").json()["items"]}
        assert listed["code-chain"]["kind"] == "code"
        assert listed["code-chain"]["module"] == "tests.crash.code_app"
        assert len(listed["code-chain"]["codeVersion"]) == 12
        bad = api.post("/v1/runs", json={"agentName": "code-chain", "input": {"n": 2}})
        assert bad.status_code == 422 and bad.headers["content-type"] == "application/problem+json"
        assert "the input needs 'url'" in bad.json()["detail"]
        assert api.get("/v1/runs").json()["items"] == []  # nothing was stored
        receiver.hold("/s3")
        run_id = start(api, "code-chain", {"url": receiver.url, "n": 4})
        assert receiver.arrived.wait(20)
    first.kill()
    receiver.release()
    with replicas.api(replicas.serve("code-1")) as api:
        run = finished(api, run_id)
        events = api.get(f"/v1/runs/{run_id}/events").json()["items"]
    assert run["status"] == "succeeded", run
    assert [receiver.count(f"/s{k}") for k in (1, 2, 4)] == [1, 1, 1]
    assert 1 <= receiver.count("/s3") <= 2 and len(receiver.keys("/s3")) == 1
    assert [a["path"] for a in run["output"]["answers"]] == ["/s1", "/s2", "/s3", "/s4"]
    assert [e["data"]["inFlight"] for e in events if e["kind"] == "run_recovered"] == [["s3"]]


def test_a_step_renamed_between_crash_and_restart_is_nondeterminism(
    replicas: Replicas, receiver: Receiver
) -> None:
    first = replicas.serve("code-2")
    with replicas.api(first) as api:
        receiver.hold("/s2")
        run_id = start(api, "renamed", {"url": receiver.url})
        assert receiver.arrived.wait(20)
    first.kill()
    receiver.release()
    second = replicas.serve("code-2", LANTERN_TEST_SECOND_STEP="summarise")
    with replicas.api(second) as api:
        run = finished(api, run_id)
    assert run["status"] == "failed", run
    error = run["error"]
    assert error["code"] == "nondeterminism"
    assert (error["position"], error["journaled"], error["requested"]) == (2, "s2", "summarise")
    assert "'s2'" in error["message"] and "'summarise'" in error["message"]


def test_a_sleep_survives_sigkill_parked_with_no_lease_and_wakes_on_time(
    replicas: Replicas,
) -> None:
    admin = make_key(replicas.database_url, "default", "admin")
    first = replicas.serve("code-3")
    with replicas.api(first) as api:
        run_id = start(api, "napper", {"seconds": 3})
        wait_until(lambda: api.get(f"/v1/runs/{run_id}").json()["status"] == "waiting", 20)
    with replicas.api(first, admin) as api:
        workers = api.get("/v1/workers").json()["items"]
        assert workers and all(run_id not in w["runs"] for w in workers)  # parked: no lease
    first.kill()
    second = replicas.serve("code-3")
    ready = time.time()
    with replicas.api(second) as api:
        run = finished(api, run_id)
        events = api.get(f"/v1/runs/{run_id}/events").json()["items"]
    assert run["status"] == "succeeded", run
    slept = run["output"]["after"] - run["output"]["before"]
    due = next(e["data"]["dueAt"] / 1000 for e in events if e["kind"] == "step_waiting")
    assert slept >= 3
    # Woken at its journaled due time (or as soon as a replica was up), not 3 s after that.
    assert run["output"]["after"] <= max(due, ready) + 2.5
    assert "run_recovered" not in [e["kind"] for e in events]


def test_run_agent_gives_one_child_across_a_crash(replicas: Replicas) -> None:
    crash = {"LANTERN_TEST_CRASH_AFTER": "step_started:child"}
    first = replicas.serve("code-4", **crash)
    with replicas.api(first) as api:
        run_id = start(api, "parent", {"x": 21})
    assert first.proc is not None
    first.proc.wait(30)  # killed itself right after journaling the child step's start
    with replicas.api(replicas.serve("code-4")) as api:
        run = finished(api, run_id)
        children = api.get(f"/v1/runs/{run_id}").json()["children"]
    assert run["status"] == "succeeded", run
    assert run["output"] == {"child": {"doubled": 42}}
    assert children == [child_run_id(run_id, "child", 1)]


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)  # two replicas share it
def test_an_approval_decided_on_another_replica_resumes_the_run(replicas: Replicas) -> None:
    a, b = replicas.serve("replica-a"), replicas.serve("replica-b")
    with replicas.api(a) as api:
        run_id = start(api, "publisher", {"text": "hello"})
        wait_until(lambda: api.get(f"/v1/runs/{run_id}").json()["status"] == "waiting", 20)
    a.kill()  # nothing of the run lives on replica a any more
    with replicas.api(b) as api:
        pending = api.get("/v1/approvals", params={"status": "pending"})
        if pending.status_code == 200:
            assert run_id in [p["runId"] for p in pending.json()["items"]]
        decided = api.post(f"/v1/runs/{run_id}/approvals/publish", json={"decision": "approve"})
        assert decided.status_code == 202, decided.text
        run = finished(api, run_id)
    assert run["status"] == "succeeded", run
    assert run["output"]["draft"] == "HELLO" and run["output"]["approved"] is True
