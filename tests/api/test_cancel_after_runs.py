"""Issue 18's cancel, as it was reproduced: a real `lantern serve` finishes three quick runs,
then a run sits in a 30 s tool and `POST /v1/runs/{id}/cancel` must stop it at once (the
cancel watcher used to have ended with the earlier runs, so the run went on and its next step
ran). Both backends."""

from __future__ import annotations

import time

import httpx

from tests.api.test_cli_operate import SLOW
from tests.helpers import wait_until
from tests.server import ALL_SCOPES, Server, make_key

QUICK = {
    "name": "quick",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "a", "type": "tool", "data": {"tool": "noop", "args": {}}},
        ],
        "edges": [{"source": "start", "target": "a"}],
    },
}


def test_a_cancel_after_three_finished_runs_stops_the_run_in_its_slow_step(
    api_server: Server,
) -> None:
    key = make_key(api_server.database_url, "default", ALL_SCOPES)
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=api_server.url, headers=headers, timeout=30) as api:
        for agent in (QUICK, SLOW):
            api.put(f"/v1/agents/{agent['name']}", json=agent).raise_for_status()
        for _ in range(3):
            run = api.post("/v1/runs", json={"agentName": "quick", "input": {}}).json()
            done = api.get(f"/v1/runs/{run['id']}", params={"wait": 30}).json()
            assert done["status"] == "succeeded", done
        time.sleep(2)  # the server idle, as between the trial's runs
        slow = api.post("/v1/runs", json={"agentName": "slow", "input": {}}).json()["id"]

        def napping() -> bool:
            items = api.get(f"/v1/runs/{slow}/events").json()["items"]
            return any(e["kind"] == "step_started" and e["stepId"] == "nap" for e in items)

        wait_until(napping, timeout=30)
        asked = time.monotonic()
        assert api.post(f"/v1/runs/{slow}/cancel").status_code == 202
        wait_until(lambda: api.get(f"/v1/runs/{slow}").json()["status"] == "cancelled", timeout=10)
        took = time.monotonic() - asked
        events = api.get(f"/v1/runs/{slow}/events").json()["items"]
    assert took < 5, f"the cancel took {took:.1f} s: it waited for the 60 s step"
    assert events[-1]["kind"] == "run_cancelled"
    assert "after" not in {e["stepId"] for e in events}  # the next step never started
