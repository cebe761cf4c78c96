"""An OpenAI Agents SDK agent that hands off to a second one, made durable, under a real
`lantern serve` SIGKILLed while its last model request is in flight and restarted with the
same worker id: the completed responses and the tool call are not repeated, and the request in
flight is sent again with the key it was first sent with. The same guarantee for Pydantic AI:
test_pydantic_ai_crash.py; for graph, plain and code-first model steps: test_llm_crash.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from lantern.ids import idempotency_key
from tests.fake_llm import Script, running
from tests.server import ALL_SCOPES, Server, make_key

APP = "tests.crash.openai_agents_app:app"


def test_a_handoff_run_keeps_its_keys_across_a_sigkill(database_url: str, tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    script = Script(
        [
            [("transfer_to_billing", {})],  # triage hands off
            [("refund", {"order": "A1"})],  # billing calls its tool
            "Refunded A1.",
        ]
    )
    with running(script=script) as fake:
        fake.hold(after=2)  # the third request (billing's answer) stays in flight
        env = {"LANTERN_WORKER_ID": "oa-1", "OA_LOG": str(log), **fake.env()}
        key = make_key(database_url, "default", ALL_SCOPES)
        headers = {"Authorization": f"Bearer {key}"}
        first = Server(database_url, tmp_path / "first.log", env=env, app=APP).start()
        second: Server | None = None
        try:
            with httpx.Client(base_url=first.url, headers=headers, timeout=30) as api:
                created = api.post(
                    "/v1/runs", json={"agentName": "support", "input": {"question": "Refund A1"}}
                )
                assert created.status_code == 202, created.text
                run_id = created.json()["id"]
                assert fake.arrived.wait(30), (tmp_path / "first.log").read_text()[-3000:]
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
    assert run["output"] == {"answer": "Refunded A1.", "agent": "billing"}
    assert keys == [
        idempotency_key(run_id, "support.model", 1),
        idempotency_key(run_id, "support.model#2", 1),
        idempotency_key(run_id, "support.model#3", 1),
        idempotency_key(run_id, "support.model#3", 1),  # the one in flight, re-sent
    ]
    refunds = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["order"] for r in refunds] == ["A1"]  # once, in the first process
    completed = [e["stepId"] for e in events if e["kind"] == "step_completed"]
    assert completed == [
        "support.model",
        "support.model#2",
        "support.tool.refund",
        "support.model#3",
    ]
    assert [e["data"]["inFlight"] for e in events if e["kind"] == "run_recovered"] == [
        ["support.model#3"]
    ]
