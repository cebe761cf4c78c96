"""A signal survives a SIGKILL of the server right after its 202 (docs/signals.md): a graph
run and a code-first run parked on a signal each get it once after the restart, whether the
kill came before the run took it or right after the take was journaled (the process dies at
its ``signal_received`` commit)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from tests.crash.test_run_control_crash import live_leases
from tests.server import ALL_SCOPES, Server, make_key

PAY = {
    "name": "pay",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "pay", "type": "signal", "data": {"name": "pay"}},
            {"id": "after", "type": "tool", "data": {"tool": "noop", "args": {"n": 1}}},
        ],
        "edges": [{"source": "start", "target": "pay"}, {"source": "pay", "target": "after"}],
    },
}


def status(api: httpx.Client, run_id: str, wanted: tuple[str, ...]) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        run: dict[str, Any] = api.get(f"/v1/runs/{run_id}").json()
        if run["status"] in wanted:
            return run
        assert time.monotonic() < deadline, run
        time.sleep(0.05)


def pay(api: httpx.Client, run_id: str) -> httpx.Response:
    """The send, under a key of its own: sent again, it is the same signal."""
    headers = {"Idempotency-Key": f"pay-{run_id}"}
    return api.post(f"/v1/runs/{run_id}/signals/pay", json={"payload": {"usd": 5}}, headers=headers)


def test_a_signal_then_a_sigkill_right_after_the_202_is_taken_once(
    database_url: str, tmp_path: Path
) -> None:
    key = make_key(database_url, "default", ALL_SCOPES)
    headers = {"Authorization": f"Bearer {key}"}
    log = tmp_path / "serve.log"
    app = "tests.crash.signal_app:app"
    # Killed at the first take it journals, if the kill after the 202 did not come first.
    # One worker id across the restart: it takes its runs back at once, not after the TTL.
    same = {"LANTERN_WORKER_ID": "signals-a"}
    env = {**same, "LANTERN_TEST_CRASH_AFTER": "signal_received:pay"}
    first = Server(database_url, log, env=env, app=app).start()
    with httpx.Client(base_url=first.url, headers=headers, timeout=30) as api:
        api.put("/v1/agents/pay", json=PAY).raise_for_status()
        runs = [
            api.post("/v1/runs", json={"agentName": agent, "input": {}}).json()["id"]
            for agent in ("pay", "pay-once")
        ]
        for run_id in runs:
            status(api, run_id, ("waiting",))
        assert not set(runs) & live_leases(database_url)  # parked: no lease, no task
        sent = []
        for run_id in runs:
            try:
                answer = pay(api, run_id)
            except httpx.TransportError:  # the server died taking the first one
                break
            assert answer.status_code == 202, answer.text
            sent.append(answer.json()["id"])
    first.kill()
    again = Server(database_url, log, env=same, app=app).start()
    try:
        with httpx.Client(base_url=again.url, headers=headers, timeout=30) as api:
            for run_id in runs[len(sent) :]:  # a send the kill cut off: the client sends again
                answer = pay(api, run_id)
                assert answer.status_code == 202, answer.text
                sent.append(answer.json()["id"])
            done = [status(api, r, ("succeeded", "failed", "cancelled")) for r in runs]
            journals = [api.get(f"/v1/runs/{r}/events").json()["items"] for r in runs]
    finally:
        again.stop()
    graph, code = done
    assert graph["status"] == "succeeded" and graph["output"] == {"n": 1}, graph
    assert code["status"] == "succeeded", code
    assert code["output"] == {"paid": {"usd": 5}, "after": "done"}
    for journal, signal_id in zip(journals, sent, strict=True):
        taken = [e for e in journal if e["kind"] == "signal_received"]
        assert [(e["stepId"], e["data"]["signalId"]) for e in taken] == [("pay", signal_id)]
        [completed] = [e for e in journal if e["kind"] == "step_completed" and e["stepId"] == "pay"]
        assert completed["data"]["output"] in (
            {"usd": 5},
            {"received": True, "payload": {"usd": 5}},
        )
