"""A run that branches on a step's output (``when``), killed with SIGKILL inside the branch it
took: after the restart it takes the same branch, the other stays skipped (journaled once as
``step_skipped``, never started) and the join runs once (both backends)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import httpx

from tests.server import ALL_SCOPES, Server, make_key
from tests.unit.test_when import triage


def agent() -> dict[str, Any]:
    definition = copy.deepcopy(triage())
    for node in definition["graph"]["nodes"][1:]:
        args = {"kind": "{{ input.kind }}"} if node["id"] == "classify" else {"at": node["id"]}
        node["data"] = {"tool": "noop", "args": args}
    return definition


def test_a_re_drive_takes_the_same_branch(database_url: str, tmp_path: Path) -> None:
    key = make_key(database_url, "default", ALL_SCOPES)
    headers = {"Authorization": f"Bearer {key}"}
    crash = {"LANTERN_WORKER_ID": "when-1", "LANTERN_TEST_CRASH_AFTER": "step_completed:refund"}
    doomed = Server(database_url, tmp_path / "doomed.log", env=crash).start()
    with httpx.Client(base_url=doomed.url, headers=headers, timeout=30) as api:
        api.put("/v1/agents/triage", json=agent()).raise_for_status()
        created = api.post("/v1/runs", json={"agentName": "triage", "input": {"kind": "refund"}})
        run_id = created.json()["id"]
    assert doomed.proc is not None
    doomed.proc.wait(30)  # it killed itself right after journaling refund's completion

    server = Server(database_url, tmp_path / "serve.log", env={"LANTERN_WORKER_ID": "when-1"})
    server.start()
    try:
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as api:
            run = api.get(f"/v1/runs/{run_id}", params={"wait": 30}).json()
            events = api.get(f"/v1/runs/{run_id}/events").json()["items"]
    finally:
        server.stop()
    assert run["status"] == "succeeded", run
    assert run["output"] == {"at": "done"}
    branch = [(e["kind"], e["stepId"]) for e in events if e["stepId"] in ("answer", "done")]
    assert branch == [
        ("step_skipped", "answer"),
        ("step_started", "done"),
        ("step_completed", "done"),
    ]
    recovered = [e["data"] for e in events if e["kind"] == "run_recovered"]
    assert [r["replayed"] for r in recovered] == [["classify", "refund", "start"]]
