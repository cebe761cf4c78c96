"""A Pydantic AI agent made durable, under a real `lantern serve` SIGKILLed between its two
model turns (the first turn and its tool call completed, the second request in flight) and
restarted with the same worker id: the completed turn and tool call are not repeated, and the
request in flight is sent again with the key it was first sent with."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from lantern.ids import idempotency_key
from tests.fake_llm import Script, running
from tests.server import ALL_SCOPES, Server, make_key

APP = "tests.crash.pydantic_app:app"


def lines(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_real_openai_model_keeps_its_keys_across_a_sigkill(
    database_url: str, tmp_path: Path
) -> None:
    """A Pydantic AI Agent with a real OpenAIChatModel against the fake provider: every request
    carries its step attempt's key; SIGKILLed while the second request is in flight, the
    restarted server sends that request again with the same key, and the tool (which reads its
    RunContext deps) ran once. The same guarantee for graph, plain and code-first runs:
    tests/crash/test_llm_crash.py; for MCP tools: test_mcp_crash.py."""
    log = tmp_path / "calls.jsonl"
    script = Script([[("count", {"item": "lamp"})], "7 lamps in stock"])
    with running(script=script) as fake:
        fake.hold(after=1)  # the first turn is answered; the second stays in flight
        env = {"LANTERN_WORKER_ID": "pai-2", "PAI_LOG": str(log), **fake.env()}
        key = make_key(database_url, "default", ALL_SCOPES)
        headers = {"Authorization": f"Bearer {key}"}
        first = Server(database_url, tmp_path / "first.log", env=env, app=APP).start()
        second: Server | None = None
        try:
            with httpx.Client(base_url=first.url, headers=headers, timeout=30) as api:
                created = api.post(
                    "/v1/runs", json={"agentName": "clerk", "input": {"question": "Lamps?"}}
                )
                assert created.status_code == 202, created.text
                run_id = created.json()["id"]
                assert fake.arrived.wait(30)  # the second request is at the provider
            first.kill()
            fake.release()
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
        keys = fake.keys()
    assert run["status"] == "succeeded", run
    assert run["output"] == {"answer": "7 lamps in stock"}
    assert keys == [
        idempotency_key(run_id, "clerk.model", 1),
        idempotency_key(run_id, "clerk.model#2", 1),
        idempotency_key(run_id, "clerk.model#2", 1),  # the one in flight, re-sent
    ]
    assert [c["kind"] for c in lines(log)] == ["tool"]  # once, in the first process
    completed = [e["stepId"] for e in events if e["kind"] == "step_completed"]
    assert completed == ["clerk.model", "clerk.tool.count", "clerk.model#2"]
    assert [e["data"]["inFlight"] for e in events if e["kind"] == "run_recovered"] == [
        ["clerk.model#2"]
    ]
