"""A decision that lands while its run is parking wakes the run.

A run parks in two commits: its ``step_waiting`` event, then its status ``waiting`` (the lease
given up). A decision taken between the two found the run running, so nothing woke it; the
parking run looks once more after its commit, but a decision whose transaction was still
open then was not there to see, and the run waited for ever. On PostgreSQL, where the two
transactions interleave, triggers widen that moment so it happens every time: the park's
status update takes 1.5 s and the decision's commit 2 s.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

from tests.server import ALL_SCOPES, Server, make_key

SLOW = """
CREATE FUNCTION slow_park() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(1.5); RETURN NEW; END $$;
CREATE TRIGGER slow_park BEFORE UPDATE ON runs FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status = 'waiting') EXECUTE FUNCTION slow_park();
CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER slow_decision AFTER INSERT ON approvals
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();
"""

GRAPH = {
    "name": "gate",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "ok", "type": "approval", "data": {"prompt": "Go?"}},
        ],
        "edges": [{"source": "start", "target": "ok"}],
    },
}


async def _events(http: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    page = await http.get(f"/v1/runs/{run_id}/events")
    page.raise_for_status()
    return list(page.json()["items"])


async def _parking(http: httpx.AsyncClient, run_id: str) -> None:
    """Return as soon as the run's step_waiting is journaled (its status still running)."""
    for _ in range(1500):
        if any(e["kind"] == "step_waiting" for e in await _events(http, run_id)):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"run {run_id} did not park")


async def _finished(http: httpx.AsyncClient, run_id: str, within: float) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        run = (await http.get(f"/v1/runs/{run_id}")).json()
        if run["status"] in ("succeeded", "failed", "cancelled"):
            return dict(run)
        await asyncio.sleep(0.1)
    raise AssertionError(f"run {run_id} is still {run['status']} after {within} s")


async def test_a_decision_taken_while_the_run_parks_wakes_it(pg_url: str, tmp_path: Path) -> None:
    server = Server(pg_url, tmp_path / "serve.log", app="tests.crash.code_app:app").start()
    key = await asyncio.to_thread(make_key, pg_url, "alice", ALL_SCOPES)
    http = httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(SLOW)
        (await http.put("/v1/agents/gate", json=GRAPH)).raise_for_status()
        started = {}
        for agent, given in (("gate", {}), ("publisher", {"text": "hi"})):
            created = await http.post("/v1/runs", json={"agentName": agent, "input": given})
            created.raise_for_status()
            started[agent] = str(created.json()["id"])
        for agent in started:
            await _parking(http, started[agent])
            answer = await http.post(
                f"/v1/runs/{started[agent]}/approvals/" + ("ok" if agent == "gate" else "publish"),
                json={"decision": "approve"},
            )
            answer.raise_for_status()
        # A park takes 1.5 s and a decision's commit 2 s: far inside this, unless a wake is lost.
        ends = {agent: await _finished(http, run_id, 30) for agent, run_id in started.items()}
    finally:
        await http.aclose()
        server.stop()
    assert {agent: run["status"] for agent, run in ends.items()} == dict.fromkeys(
        started, "succeeded"
    )
    assert ends["publisher"]["output"]["approved"] is True
