"""A process killed between the commit that finishes a run and issuing its receipt: the run
must not stay without one. The next read of the receipt issues it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from lantern.engine.runs import apply_agent, create_run
from lantern.receipts.verify import verify
from lantern.server.auth import issue_key
from lantern.store import Store
from tests.crash.processes import Serve
from tests.server import Server

NOOP = {
    "name": "noop",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "t", "type": "tool", "data": {"tool": "noop", "args": {"x": "{{ input.x }}"}}},
        ],
        "edges": [{"source": "start", "target": "t"}],
    },
}


async def test_a_receipt_lost_to_a_crash_is_issued_when_read(store: Store, tmp_path: Path) -> None:
    await apply_agent(store, NOOP)
    run = await create_run(store, "noop", {"x": 1})
    doomed = Serve(store.url, tmp_path / "serve.log", LANTERN_TEST_CRASH_AFTER="run_succeeded:")
    deadline = time.monotonic() + 30
    while doomed.proc.poll() is None:  # it kills itself right after the finishing commit
        assert time.monotonic() < deadline, doomed.output()
        await asyncio.sleep(0.05)
    doomed.out.close()
    finished = await store.get_run(run.id)
    assert finished is not None and finished.status == "succeeded"
    assert await store.get_receipt(run.id) is None

    _, key = await issue_key(store, "default", {"runs:read"})
    server = Server(store.url, tmp_path / "serve2.log").start()
    try:
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as http:
            answer = await http.get(f"/v1/runs/{run.id}/receipt")
            assert answer.status_code == 200, answer.text
            keys = (await http.get("/v1/receipts/keys")).json()["keys"]
            events = (await http.get(f"/v1/runs/{run.id}/events")).json()["items"]
    finally:
        server.stop()
    assert verify({"events": events, **answer.json()}, keys) == []
    assert await store.get_receipt(run.id) is not None
