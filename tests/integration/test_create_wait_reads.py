"""What ``POST /v1/runs?wait=`` reads of the run it made: once, when the run has ended, its
children with it (``Store.run_detail``).

The run a replica starts at its create (``Worker.start_new``) is as its opening commit stored
it until it ends, and its end is heard by the commit notifier (remembered for a run that ended
before the waiter subscribed): reading it before the wait bought nothing but a round trip per
run, on PostgreSQL a query of the server path that the same run driven in-process never made
(bench/service.py). The app runs in this process, against a real store on both backends, so
the route's reads of the run can be counted where they reach the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lantern
from tests.in_process_api import count_calls, requested, served

app = lantern.App()


async def noop() -> None:
    return None


@app.agent("one-step")
async def one_step(ctx: lantern.Context, n: int) -> dict[str, int]:
    await ctx.step("s1", noop)
    return {"n": n}


async def test_a_create_that_waits_reads_its_started_run_once(
    database_url: str, tmp_path: Path
) -> None:
    async with served(app, database_url, tmp_path, "reads-1") as (client, services):
        reads = count_calls(services.store, ("get_run", "run_detail", "children", "run_key"))

        async def create(n: int) -> dict[str, Any]:
            response = await requested(
                client.post(
                    "/v1/runs",
                    params={"wait": 30},
                    json={"agentName": "one-step", "input": {"n": n}},
                )
            )
            assert response.status_code == 200, response.text
            body: dict[str, Any] = response.json()
            assert body["status"] == "succeeded" and body["output"] == {"n": n}, body
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
