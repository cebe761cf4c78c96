"""A SIGKILL during a retry backoff: the next attempt runs after the restart, with its own key."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from lantern.demo.receiver import Receiver
from lantern.ids import idempotency_key
from tests.server import ALL_SCOPES, Server, make_key


def test_killed_during_attempt_2s_backoff_runs_attempt_2_after_the_restart(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    key = make_key(database_url, "default", ALL_SCOPES)
    headers = {"Authorization": f"Bearer {key}"}
    env = {"LANTERN_WORKER_ID": "retry-1"}
    agent = {
        "name": "flaky",
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {
                    "id": "call",
                    "type": "connector",
                    "data": {
                        "connector": "http",
                        "url": f"{receiver.url}/flaky",
                        "retry": {"maxAttempts": 3, "backoffMs": 4000},
                    },
                },
            ],
            "edges": [{"source": "start", "target": "call"}],
        },
    }
    receiver.fail("/flaky", 503, 1)
    first = Server(database_url, tmp_path / "serve.log", env=env).start()
    with httpx.Client(base_url=first.url, headers=headers, timeout=30) as api:
        api.put("/v1/agents/flaky", json=agent).raise_for_status()
        run_id = api.post("/v1/runs", json={"agentName": "flaky", "input": {}}).json()["id"]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            events = api.get(f"/v1/runs/{run_id}/events").json()["items"]
            if any(e["kind"] == "step_retrying" for e in events):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("no step_retrying was journaled")
    first.kill()  # attempt 1 failed and attempt 2 is waiting out its backoff
    assert receiver.count("/flaky") == 1

    second = Server(database_url, tmp_path / "serve.log", env=env).start()
    try:
        with httpx.Client(base_url=second.url, headers=headers, timeout=30) as api:
            run = api.get(f"/v1/runs/{run_id}", params={"wait": 20}).json()
            assert run["status"] == "succeeded", run
            events = api.get(f"/v1/runs/{run_id}/events").json()["items"]
    finally:
        second.stop()
    assert [h.idempotency_key for h in receiver.hits] == [
        idempotency_key(run_id, "call", 1),
        idempotency_key(run_id, "call", 2),
    ]
    started = [
        e["attempt"] for e in events if e["kind"] == "step_started" and e["stepId"] == "call"
    ]
    assert started == [1, 2]  # attempt 2 ran once, after the restart; attempt 1 never again
    retrying = [e for e in events if e["kind"] == "step_retrying"]
    assert len(retrying) == 1 and retrying[0]["data"]["attempt"] == 2
    recovered = next(i for i, e in enumerate(events) if e["kind"] == "run_recovered")
    attempt2 = next(
        i for i, e in enumerate(events) if e["kind"] == "step_started" and e["attempt"] == 2
    )
    assert recovered < attempt2
