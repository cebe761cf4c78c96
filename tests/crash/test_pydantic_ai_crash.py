"""A Pydantic AI agent made durable, under a real `lantern serve` SIGKILLed between its two
model turns (the first turn and its tool call completed, the second request in flight) and
restarted with the same worker id: the completed turn and tool call are not repeated."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import wait_until
from tests.server import ALL_SCOPES, Server, make_key

APP = "tests.crash.pydantic_app:app"


def lines(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_sigkill_between_two_turns_repeats_neither_the_turn_nor_the_tool(
    database_url: str, tmp_path: Path
) -> None:
    log, release = tmp_path / "calls.jsonl", tmp_path / "release"
    env = {"LANTERN_WORKER_ID": "pai-1", "PAI_LOG": str(log), "PAI_RELEASE": str(release)}
    key = make_key(database_url, "default", ALL_SCOPES)
    headers = {"Authorization": f"Bearer {key}"}
    first = Server(database_url, tmp_path / "first.log", env=env, app=APP).start()
    second: Server | None = None
    try:
        with httpx.Client(base_url=first.url, headers=headers, timeout=30) as api:
            created = api.post(
                "/v1/runs", json={"agentName": "shop", "input": {"question": "Lamps?"}}
            )
            assert created.status_code == 202, created.text
            run_id = created.json()["id"]
            # The second model request has begun: turn 1 and the tool call are journaled.
            wait_until(lambda: [c["kind"] for c in lines(log)] == ["model", "tool", "model"], 30)
        first.kill()
        release.touch()
        second = Server(database_url, tmp_path / "second.log", env=env, app=APP).start()
        with httpx.Client(base_url=second.url, headers=headers, timeout=30) as api:
            deadline = time.monotonic() + 30
            run = api.get(f"/v1/runs/{run_id}", params={"wait": 10}).json()
            while run["status"] not in ("succeeded", "failed") and time.monotonic() < deadline:
                run = api.get(f"/v1/runs/{run_id}", params={"wait": 10}).json()
            events = api.get(f"/v1/runs/{run_id}/events").json()["items"]
    finally:
        for server in (first, second):
            if server is not None and server.proc is not None and server.proc.poll() is None:
                server.kill()
    assert run["status"] == "succeeded", run
    assert run["output"] == {"answer": "7 lamps in stock"}
    calls = lines(log)
    # Turn 1 and the tool ran once, in the first process; turn 2 was in flight and ran again.
    assert [(c["kind"], c.get("turn")) for c in calls] == [
        ("model", 1),
        ("tool", None),
        ("model", 2),
        ("model", 2),
    ]
    assert calls[0]["pid"] == calls[1]["pid"] != calls[3]["pid"]
    completed = [e["stepId"] for e in events if e["kind"] == "step_completed"]
    assert completed == ["shop.model", "shop.tool.stock", "shop.model#2"]
    assert [e["data"]["inFlight"] for e in events if e["kind"] == "run_recovered"] == [
        ["shop.model#2"]
    ]
