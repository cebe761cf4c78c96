"""ctx.tool in a microVM reaches an MCP server's tool: the control plane performs it as a
journaled step, starting the server the App registers, as for an in-process agent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lantern.ids import idempotency_key
from lantern.integrations.mcp import KEY_META
from tests.conftest import sqlite_url
from tests.runtime.cluster import Cluster
from tests.runtime.conftest import working
from tests.runtime.test_microvm_runs import kinds

pytestmark = pytest.mark.timeout(240)


def test_ctx_tool_in_a_vm_calls_the_control_planes_mcp_server(tmp_path: Path) -> None:
    working("sandbox")
    log = tmp_path / "notes.jsonl"
    cluster = Cluster(sqlite_url(tmp_path), tmp_path).serve(NOTES_LOG=str(log))
    try:
        cluster.node("n1")
        cluster.agent("jots", "mcp_tools:jots")
        run_id = cluster.start_run("jots", {"text": "vm note"})
        run = cluster.finished(run_id)
        events = cluster.events(run_id)
    finally:
        cluster.close()
    assert run["status"] == "succeeded", run
    assert run["output"]["added"] == {"count": 1, "text": "vm note"}
    assert [k for k in kinds(events) if k[1] is not None] == [
        ("step_started", "notes.add"), ("step_completed", "notes.add"),
    ]  # fmt: skip
    made = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(c["tool"], c["args"]) for c in made] == [("add", {"text": "vm note"})]
    assert made[0]["meta"][KEY_META] == idempotency_key(run_id, "notes.add", 1)
