"""Code-first agents survive a SIGKILL of the real server: replay, parking, children, changes."""

from __future__ import annotations

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


@contextmanager
def api_of(server: Server, key: str) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as api:
        yield api


_started: list[Server] = []


def serve(database_url: str, tmp_path: Path, worker: str, **env: str) -> Server:
    env = {"LANTERN_WORKER_ID": worker, **env}
    server = Server(database_url, tmp_path / f"{worker}.log", env=env, app=APP)
    _started.append(server)
    return server.start()


@pytest.fixture(autouse=True)
def _stop_servers() -> Iterator[None]:
    """Whatever a test leaves running (it failed half-way) is stopped, not leaked."""
    yield
    while _started:
        server = _started.pop()
        if server.proc is not None and server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(10)


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
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    key = make_key(database_url, "default", ALL_SCOPES)
    first = serve(database_url, tmp_path, "code-1")
    with api_of(first, key) as api:
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
    second = serve(database_url, tmp_path, "code-1")
    try:
        with api_of(second, key) as api:
            run = finished(api, run_id)
            events = api.get(f"/v1/runs/{run_id}/events").json()["items"]
    finally:
        second.stop()
    assert run["status"] == "succeeded", run
    assert [receiver.count(f"/s{k}") for k in (1, 2, 4)] == [1, 1, 1]
    assert 1 <= receiver.count("/s3") <= 2 and len(receiver.keys("/s3")) == 1
    assert [a["path"] for a in run["output"]["answers"]] == ["/s1", "/s2", "/s3", "/s4"]
    assert [e["data"]["inFlight"] for e in events if e["kind"] == "run_recovered"] == [["s3"]]


def test_a_step_renamed_between_crash_and_restart_is_nondeterminism(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    key = make_key(database_url, "default", ALL_SCOPES)
    first = serve(database_url, tmp_path, "code-2")
    with api_of(first, key) as api:
        receiver.hold("/s2")
        run_id = start(api, "renamed", {"url": receiver.url})
        assert receiver.arrived.wait(20)
    first.kill()
    receiver.release()
    second = serve(database_url, tmp_path, "code-2", LANTERN_TEST_SECOND_STEP="summarise")
    try:
        with api_of(second, key) as api:
            run = finished(api, run_id)
    finally:
        second.stop()
    assert run["status"] == "failed", run
    error = run["error"]
    assert error["code"] == "nondeterminism"
    assert (error["position"], error["journaled"], error["requested"]) == (2, "s2", "summarise")
    assert "'s2'" in error["message"] and "'summarise'" in error["message"]


def test_a_sleep_survives_sigkill_parked_with_no_lease_and_wakes_on_time(
    database_url: str, tmp_path: Path
) -> None:
    key = make_key(database_url, "default", ALL_SCOPES)
    admin = make_key(database_url, "default", "admin")
    first = serve(database_url, tmp_path, "code-3")
    with api_of(first, key) as api:
        run_id = start(api, "napper", {"seconds": 3})
        wait_until(lambda: api.get(f"/v1/runs/{run_id}").json()["status"] == "waiting", 20)
    with api_of(first, admin) as api:
        workers = api.get("/v1/workers").json()["items"]
        assert workers and all(run_id not in w["runs"] for w in workers)  # parked: no lease
    first.kill()
    second = serve(database_url, tmp_path, "code-3")
    ready = time.time()
    try:
        with api_of(second, key) as api:
            run = finished(api, run_id)
            events = api.get(f"/v1/runs/{run_id}/events").json()["items"]
    finally:
        second.stop()
    assert run["status"] == "succeeded", run
    slept = run["output"]["after"] - run["output"]["before"]
    due = next(e["data"]["dueAt"] / 1000 for e in events if e["kind"] == "step_waiting")
    assert slept >= 3
    # Woken at its journaled due time (or as soon as a replica was up), not 3 s after that.
    assert run["output"]["after"] <= max(due, ready) + 2.5
    assert "run_recovered" not in [e["kind"] for e in events]


def test_run_agent_gives_one_child_across_a_crash(database_url: str, tmp_path: Path) -> None:
    key = make_key(database_url, "default", ALL_SCOPES)
    crash = {"LANTERN_TEST_CRASH_AFTER": "step_started:child"}
    first = serve(database_url, tmp_path, "code-4", **crash)
    with api_of(first, key) as api:
        run_id = start(api, "parent", {"x": 21})
    assert first.proc is not None
    first.proc.wait(30)  # killed itself right after journaling the child step's start
    second = serve(database_url, tmp_path, "code-4")
    try:
        with api_of(second, key) as api:
            run = finished(api, run_id)
            children = api.get(f"/v1/runs/{run_id}").json()["children"]
    finally:
        second.stop()
    assert run["status"] == "succeeded", run
    assert run["output"] == {"child": {"doubled": 42}}
    assert children == [child_run_id(run_id, "child", 1)]


def test_an_approval_decided_on_another_replica_resumes_the_run(
    pg_url: str, tmp_path: Path
) -> None:
    key = make_key(pg_url, "default", ALL_SCOPES)
    a = serve(pg_url, tmp_path, "replica-a")
    b = serve(pg_url, tmp_path, "replica-b")
    try:
        with api_of(a, key) as api:
            run_id = start(api, "publisher", {"text": "hello"})
            wait_until(lambda: api.get(f"/v1/runs/{run_id}").json()["status"] == "waiting", 20)
        a.kill()  # nothing of the run lives on replica a any more
        with api_of(b, key) as api:
            pending = api.get("/v1/approvals", params={"status": "pending"})
            if pending.status_code == 200:
                assert run_id in [p["runId"] for p in pending.json()["items"]]
            decided = api.post(f"/v1/runs/{run_id}/approvals/publish", json={"decision": "approve"})
            assert decided.status_code == 202, decided.text
            run = finished(api, run_id)
    finally:
        b.stop()
    assert run["status"] == "succeeded", run
    assert run["output"]["draft"] == "HELLO" and run["output"]["approved"] is True
