"""Retrying a failed run from a step, with the server SIGKILLed in the retried part (both
backends): the steps before it are replayed from the original's journal (never re-sent), the
steps from it run again with fresh keys, the crash costs only the step in flight, and the new
run's chain and receipt verify."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from lantern.demo.receiver import Receiver
from lantern.receipts.verify import verify
from tests.helpers import http_chain, wait_until
from tests.server import ALL_SCOPES, Server, make_key


def test_retry_from_a_step_survives_a_sigkill_in_the_retried_part(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    key = make_key(database_url, "default", ALL_SCOPES)
    headers = {"Authorization": f"Bearer {key}"}
    env = {"LANTERN_WORKER_ID": "retry-1"}
    first = Server(database_url, tmp_path / "serve.log", env=env).start()
    with httpx.Client(base_url=first.url, headers=headers, timeout=30) as api:
        api.put("/v1/agents/chain", json=http_chain("chain", receiver.url, 4)).raise_for_status()
        receiver.fail("/s3", 400, 1)  # the original fails at s3, for good (a 400 is final)
        original = api.post("/v1/runs", json={"agentName": "chain", "input": {"n": 1}}).json()
        failed = api.get(f"/v1/runs/{original['id']}", params={"wait": 30}).json()
        assert failed["status"] == "failed" and failed["error"]["step"] == "s3", failed
        before: list[dict[str, Any]] = api.get(f"/v1/runs/{original['id']}/events").json()["items"]
        first_keys = {p: receiver.keys(p) for p in ("/s1", "/s2", "/s3")}

        bad = api.post(f"/v1/runs/{original['id']}/retry", json={"fromStep": "nope"})
        assert bad.status_code == 422 and "s1, s2, s3, s4" in bad.json()["detail"]
        receiver.hold("/s3")
        retried = api.post(f"/v1/runs/{original['id']}/retry", json={"fromStep": "s2"})
        assert retried.status_code == 202, retried.text
        new = retried.json()
        assert new["id"] != original["id"] and new["agentVersion"] == original["agentVersion"]
        assert receiver.arrived.wait(20)  # s3 of the retry is in flight
    first.kill()
    receiver.release()

    second = Server(database_url, tmp_path / "serve.log", env=env).start()
    try:
        with httpx.Client(base_url=second.url, headers=headers, timeout=30) as api:
            run = api.get(f"/v1/runs/{new['id']}", params={"wait": 30}).json()
            assert run["status"] == "succeeded", run
            events: list[dict[str, Any]] = api.get(f"/v1/runs/{new['id']}/events").json()["items"]
            wait_until(lambda: api.get(f"/v1/runs/{new['id']}/receipt").status_code == 200)
            receipt = api.get(f"/v1/runs/{new['id']}/receipt").json()
            keys = api.get("/v1/receipts/keys").json()["keys"]
            again = api.post(f"/v1/runs/{new['id']}/retry", json={})
            assert again.status_code == 409 and "succeeded" in again.json()["detail"]
            untouched = api.get(f"/v1/runs/{original['id']}").json()
    finally:
        second.stop()

    assert untouched["status"] == "failed"
    # s1 was replayed, never re-sent; s2 and s3 ran again with this run's keys; s4 once.
    assert receiver.count("/s1") == 1 and receiver.count("/s4") == 1
    assert receiver.count("/s2") == 2 and len(receiver.keys("/s2") - first_keys["/s2"]) == 1
    assert len(receiver.keys("/s3") - first_keys["/s3"]) == 1  # one new key, crash or not

    opened = events[0]
    assert opened["kind"] == "run_started"
    assert opened["data"] == {"retryOf": original["id"], "fromStep": "s2"}
    sources = {e["seq"]: e for e in before}
    replayed = [e for e in events if e["kind"] == "step_completed" and "replayedFrom" in e["data"]]
    assert [e["stepId"] for e in replayed] == ["start", "s1"]
    for e in replayed:
        source = e["data"]["replayedFrom"]
        copied = sources[source["seq"]]
        assert source["runId"] == original["id"] and source["hash"] == copied["hash"]
        assert copied["stepId"] == e["stepId"] and e["data"]["output"] == copied["data"]["output"]
    ran = [e["stepId"] for e in events if e["kind"] == "step_completed"]
    assert ran == ["start", "s1", "s2", "s3", "s4"]
    recoveries = [e["data"] for e in events if e["kind"] == "run_recovered"]
    assert [(r["inFlight"], r["fromWorker"]) for r in recoveries] == [(["s3"], "retry-1")]
    assert verify({"events": events, **receipt}, keys) == []
    # The server log says so, a line each: the retry's start and its recovery after the kill.
    log = (tmp_path / "serve.log").read_text()
    started = [line for line in log.splitlines() if f"run started run_id={new['id']}" in line]
    assert len(started) == 1 and f"retrying {original['id']} from s2" in started[0], started
    assert "worker=retry-1 status=waiting" in started[0]
    recovered = [line for line in log.splitlines() if f"run recovered run_id={new['id']}" in line]
    assert len(recovered) == 1 and "worker=retry-1 step=s3" in recovered[0], recovered
    assert "from retry-1 (recovery 1)" in recovered[0]
