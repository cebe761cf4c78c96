"""A run submitted over HTTP survives a SIGKILL of the server mid-step."""

from __future__ import annotations

from pathlib import Path

import httpx

from lantern.demo.receiver import Receiver
from tests.helpers import http_chain
from tests.server import ALL_SCOPES, Server, make_key


def test_server_sigkilled_mid_step_finishes_the_run_after_restart(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    key = make_key(database_url, "default", ALL_SCOPES)
    headers = {"Authorization": f"Bearer {key}"}
    env = {"LANTERN_WORKER_ID": "api-1"}
    first = Server(database_url, tmp_path / "serve.log", env=env).start()
    with httpx.Client(base_url=first.url, headers=headers, timeout=30) as api:
        api.put("/v1/agents/chain", json=http_chain("chain", receiver.url, 4)).raise_for_status()
        receiver.hold("/s3")
        created = api.post("/v1/runs", json={"agentName": "chain", "input": {"n": 1}})
        assert created.status_code == 202
        run_id = created.json()["id"]
        assert receiver.arrived.wait(20)
    first.kill()
    receiver.release()

    second = Server(database_url, tmp_path / "serve.log", env=env).start()
    try:
        with httpx.Client(base_url=second.url, headers=headers, timeout=30) as api:
            run = api.get(f"/v1/runs/{run_id}", params={"wait": 20}).json()
            assert run["status"] == "succeeded", run
            events = api.get(f"/v1/runs/{run_id}/events").json()["items"]
    finally:
        second.stop()
    assert [receiver.count(f"/s{k}") for k in (1, 2, 4)] == [1, 1, 1]
    assert 1 <= receiver.count("/s3") <= 2 and len(receiver.keys("/s3")) == 1
    completed = [e["stepId"] for e in events if e["kind"] == "step_completed"]
    assert sorted(completed) == ["s1", "s2", "s3", "s4", "start"]
    assert [e["data"]["inFlight"] for e in events if e["kind"] == "run_recovered"] == [["s3"]]
