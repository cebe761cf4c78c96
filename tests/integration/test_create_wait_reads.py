"""What ``POST /v1/runs?wait=`` reads of the run it made: once, when the run has ended, its
children with it (``Store.run_detail``).

The run a replica starts at its create (``Worker.start_new``) is as its opening commit stored
it until it ends, and its end is heard by the commit notifier (remembered for a run that ended
before the waiter subscribed): reading it before the wait bought nothing but a round trip per
run, on PostgreSQL a query of the server path that the same run driven in-process never made
(bench/service.py). The app runs in this process, against a real store on both backends, so
the route's reads of the run can be counted where they reach the store.

For graph, plain and code-first agents alike: each is started at its create by the same
``Worker.start_new``. A microVM run is not (the runtime scheduler places it), so its create
reads it as any queued run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import lantern
from lantern.server.routes import runs as run_routes
from tests.fake_llm import FakeProvider
from tests.in_process_api import count_calls, requested, served

KINDS = ("graph", "plain", "code")

app = lantern.App()


@app.tool("noop")
async def noop() -> None:
    return None


@app.agent("one-step-code")
async def one_step(ctx: lantern.Context, n: int) -> dict[str, int]:
    await ctx.step("s1", noop)
    return {"n": n}


DEFINITIONS: dict[str, dict[str, Any]] = {
    "graph": {
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "s1", "type": "tool", "data": {"tool": "noop", "args": {}}},
            ],
            "edges": [{"source": "start", "target": "s1"}],
        }
    },
    "plain": {"model": "gpt-4o-mini", "maxTokens": 30},
}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_create_that_waits_reads_its_started_run_once(
    database_url: str,
    tmp_path: Path,
    fake: FakeProvider,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The waiter's safety net, a re-read every REREAD_S even unnotified, is not what is
    # counted here: on a loaded machine a run can outlast it (two reads, the first unfinished).
    monkeypatch.setattr(run_routes, "REREAD_S", 30.0)
    agent = f"one-step-{kind}"
    async with served(app, database_url, tmp_path, "reads-1") as (client, services):
        if kind in DEFINITIONS:
            await services.store.put_agent("default", agent, {"name": agent, **DEFINITIONS[kind]})
        reads = count_calls(services.store, ("get_run", "run_detail", "children", "run_key"))

        async def create(n: int) -> dict[str, Any]:
            response = await requested(
                client.post(
                    "/v1/runs", params={"wait": 30}, json={"agentName": agent, "input": {"n": n}}
                )
            )
            assert response.status_code == 200, response.text
            body: dict[str, Any] = response.json()
            assert body["status"] == "succeeded", body
            assert body["children"] == []
            return body

        # The first run of an agent is stored queued and then driven (the drive is made for
        # the agent's version once); from the second on, the create starts the run itself.
        await create(0)
        for n in range(1, 4):
            reads.clear()
            body = await create(n)
            # The finished run, read once, its children with it.
            assert reads == [("run_detail", body["id"])], reads

        # A read of the finished run through the API is one query too.
        reads.clear()
        got = await requested(client.get(f"/v1/runs/{body['id']}", params={"wait": 5}))
        assert got.status_code == 200, got.text
        assert (got.json()["children"], got.json()["schedule"]) == ([], None)
        assert reads == [("run_detail", body["id"])], reads
