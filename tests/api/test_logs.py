"""The server's log lines: one per run start, finish and failure with the run, agent, worker and
step, as JSON objects with --log-format json; a tool's traceback in the log and never in the
API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import sqlite_url
from tests.server import ALL_SCOPES, Server, make_key


def agent(tool: str) -> dict[str, Any]:
    return {
        "name": f"use-{tool}",
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "work", "type": "tool", "data": {"tool": tool, "args": {"a": 1}}},
            ],
            "edges": [{"source": "start", "target": "work"}],
        },
    }


def test_json_log_lines_name_the_run_and_keep_the_traceback_out_of_the_api(
    tmp_path: Path,
) -> None:
    db = sqlite_url(tmp_path)
    env = {"LANTERN_LOG_FORMAT": "json", "LANTERN_WORKER_ID": "logs-1"}
    server = Server(db, tmp_path / "serve.log", env=env).start()
    key = make_key(db, "default", ALL_SCOPES)
    try:
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as api:
            runs = {}
            for tool in ("noop", "explode"):
                api.put(f"/v1/agents/use-{tool}", json=agent(tool)).raise_for_status()
                created = api.post("/v1/runs", json={"agentName": f"use-{tool}", "input": {}})
                runs[tool] = api.get(f"/v1/runs/{created.json()['id']}", params={"wait": 30}).json()
            events = api.get(f"/v1/runs/{runs['explode']['id']}/events").text
    finally:
        server.stop()
    ok, bad = runs["noop"], runs["explode"]
    assert ok["status"] == "succeeded" and bad["status"] == "failed"
    assert "Traceback" not in json.dumps(bad) and "Traceback" not in events
    assert "kaboom" in bad["error"]["message"]

    lines = [json.loads(line) for line in server.log.read_text().splitlines() if line.strip()]
    assert all({"ts", "level", "logger", "message"} <= line.keys() for line in lines)
    by_run = [(line.get("runId"), line.get("event")) for line in lines if line.get("event")]
    assert (ok["id"], "run_started") in by_run and (ok["id"], "run_succeeded") in by_run
    failed = next(line for line in lines if line.get("event") == "run_failed")
    assert failed["runId"] == bad["id"] and failed["step"] == "work"
    assert failed["agent"] == "use-explode v1" and failed["worker"] == "logs-1"
    assert failed["error"] == "step_failed" and failed["level"] == "warning"
    raised = next(line for line in lines if line["logger"] == "lantern.tools")
    assert raised["runId"] == bad["id"] and raised["step"] == "work"
    assert "Traceback" in raised["exception"] and "RuntimeError: kaboom" in raised["exception"]
