"""A microVM workload's ctx.deliver_once and ctx.live_text, as in-process (docs/code-agents.md):
a delivery claimed and recorded by the control plane around the VM's own dispatch (kind
``code``, its ``to``), a retried attempt served the recorded answer; a step's live text on the
run's stream as deltas, never journaled. Under the sandbox driver."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from lantern.ids import idempotency_key
from tests.conftest import sqlite_url
from tests.runtime.cluster import Cluster
from tests.runtime.conftest import working
from tests.sse import Frame, frames

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    working("sandbox")
    tmp = tmp_path_factory.mktemp("live")
    found = Cluster(sqlite_url(tmp), tmp).serve(1)
    found.node("n1")
    try:
        found.wait_for(
            lambda: found.ok("GET", "/v1/runtime/nodes", key=found.operator)["items"], 60
        )
        yield found
    finally:
        found.close()


def test_a_vms_deliveries_are_claimed_once_with_kind_code_and_where_they_go(
    cluster: Cluster,
) -> None:
    cluster.agent("delivers", "delivering:delivers")
    run_id = cluster.start_run("delivers", {})
    run = cluster.finished(run_id)
    assert run["status"] == "succeeded", run["error"]
    out = run["output"]
    # The receipt was dispatched once, by attempt 1; attempt 2 got the recorded answer.
    assert [s["to"] for s in out["sent"]] == [
        "https://hooks.example/notice",
        "mailto:ada@example.com",
    ]
    assert out["receipt"]["attempt"] == 2
    assert out["receipt"]["answer"] == out["sent"][1]
    assert out["notice"] == out["sent"][0]
    items = cluster.ok("GET", f"/v1/runs/{run_id}/deliveries")["items"]
    got = [
        (d["stepId"], d["name"], d["kind"], d["target"], d["status"], d["attempt"]) for d in items
    ]
    assert got == [
        ("notice", "notice", "code", "https://hooks.example/notice", "delivered", 1),
        ("send", "receipt", "code", "mailto:ada@example.com", "delivered", 1),
    ]
    assert [d["response"] for d in items] == out["sent"]
    assert [d["idempotencyKey"] for d in items] == [
        idempotency_key(run_id, "notice", 1),
        idempotency_key(run_id, "send", 1),
    ]
    # The step that delivered did fail once, and its retry did not dispatch again.
    kinds = [(e["kind"], e.get("stepId")) for e in cluster.events(run_id)]
    assert ("step_retrying", "send") in kinds


async def _follow(cluster: Cluster, run_id: str) -> list[Frame]:
    server = cluster.servers[0]
    headers = {"Authorization": f"Bearer {cluster.key}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as http:
        stream = frames(http, run_id)
        got: list[Frame] = []
        async for frame in stream:
            got.append(frame)
            if frame.event == "journal" and frame.data["kind"] == "step_waiting":
                break
        approved = await http.post(f"/v1/runs/{run_id}/approvals/go", json={"decision": "approve"})
        approved.raise_for_status()
        got += [f async for f in stream]
    return got


def test_a_vms_live_text_reaches_the_runs_followers_and_is_never_journaled(
    cluster: Cluster,
) -> None:
    cluster.agent("streams", "delivering:streams")
    words = "one two three four"
    run_id = cluster.start_run("streams", {"words": words})
    got = asyncio.run(_follow(cluster, run_id))
    run = cluster.finished(run_id)
    assert run["status"] == "succeeded", run["error"]
    assert run["output"] == {"streamed": True, "text": words}
    deltas = [f.data for f in got if f.event == "delta"]
    assert "".join(d["text"] for d in deltas) == "one two three four "
    assert {(d["stepId"], d["attempt"]) for d in deltas} == {("write", 1)}
    completed = next(
        i
        for i, f in enumerate(got)
        if f.event == "journal"
        and f.data["kind"] == "step_completed"
        and f.data["stepId"] == "write"
    )
    assert max(i for i, f in enumerate(got) if f.event == "delta") < completed
    assert not any("delta" in e["kind"] for e in cluster.events(run_id))
    # Nobody following: the workload is told so and does not stream.
    cluster.agent("streams-alone", "delivering:streams")
    alone = cluster.start_run("streams-alone", {"words": "quiet"})

    def parked() -> bool:
        """the run waits at its approval"""
        return any(e["kind"] == "step_waiting" for e in cluster.events(alone))

    cluster.wait_for(parked, 90)
    cluster.ok("POST", f"/v1/runs/{alone}/approvals/go", json={"decision": "approve"})
    assert cluster.finished(alone)["output"] == {"streamed": False, "text": "quiet"}
