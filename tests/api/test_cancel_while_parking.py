"""A cancel that arrives while its run is about to park is not lost.

The replica executing a run sees a cancel through its lease keeper, which looks once a
second. A run whose step ends between the cancel and that look parks at its next approval
and gives its lease up, so nobody was left to act on the flag: the run stayed ``waiting``
until someone decided the approval, although the cancel had been accepted. Each run here
cancels during a short step right before an approval, so most of them park before the
keeper's next look (both backends, a real server)."""

from __future__ import annotations

import functools
from typing import Any

import httpx

from tests.helpers import wait_until
from tests.server import Server, make_key

RUNS = 6

AGENT = {
    "name": "nap-then-ask",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "nap", "type": "tool", "data": {"tool": "sleep", "args": {"seconds": 0.2}}},
            {"id": "ok", "type": "approval", "data": {"prompt": "Go on?"}},
        ],
        "edges": [{"source": "start", "target": "nap"}, {"source": "nap", "target": "ok"}],
    },
}


def _kinds(api: httpx.Client, run_id: str) -> list[str]:
    return [e["kind"] for e in api.get(f"/v1/runs/{run_id}/events").json()["items"]]


def test_a_cancel_just_before_a_park_finishes_the_run(api_server: Server) -> None:
    key = make_key(api_server.database_url, "acme", "runs:execute,runs:read,agents:write")
    with httpx.Client(
        base_url=api_server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as api:
        api.put("/v1/agents/nap-then-ask", json=AGENT).raise_for_status()
        runs = []
        for _ in range(RUNS):
            made = api.post("/v1/runs", json={"agentName": "nap-then-ask", "input": {}})
            run_id = made.json()["id"]
            wait_until(functools.partial(_napping, api, run_id), every=0.01)
            cancelled = api.post(f"/v1/runs/{run_id}/cancel")
            assert cancelled.status_code in (200, 202), cancelled.text
            runs.append(run_id)
        ends: dict[str, Any] = {}
        for run_id in runs:
            wait_until(functools.partial(_cancelled, api, run_id), timeout=15)
            ends[run_id] = _kinds(api, run_id)
    for kinds in ends.values():
        assert kinds[-1] == "run_cancelled" and kinds.count("run_cancelled") == 1


def _cancelled(api: httpx.Client, run_id: str) -> bool:
    status: str = api.get(f"/v1/runs/{run_id}").json()["status"]
    return status == "cancelled"


def _napping(api: httpx.Client, run_id: str) -> bool:
    events = api.get(f"/v1/runs/{run_id}/events").json()["items"]
    return any(e["kind"] == "step_started" and e["stepId"] == "nap" for e in events)
