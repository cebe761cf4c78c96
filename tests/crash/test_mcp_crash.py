"""A graph calling an MCP server's tool, SIGKILLed after the tool's step completed and before
the next step: the tool was called once, with the step's key in ``_meta``, and the run
finishes on restart without calling it again (a real `lantern serve`, a real MCP server)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from lantern.engine.runs import apply_agent, create_run
from lantern.ids import idempotency_key
from lantern.integrations.mcp import KEY_META
from lantern.store import Store
from tests.crash.processes import Serve
from tests.crash.test_sigkill import completions, wait_for_status

NOTES: dict[str, Any] = {
    "name": "notes-then-noop",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "add", "type": "tool", "data": {"tool": "notes.add", "args": {"text": "x"}}},
            {
                "id": "after",
                "type": "tool",
                "data": {"tool": "noop", "args": {"n": "{{ steps.add.output.count }}"}},
            },
        ],
        "edges": [{"source": "start", "target": "add"}, {"source": "add", "target": "after"}],
    },
}


async def test_a_crash_after_an_mcp_tool_completed_never_calls_it_again(
    store: Store, tmp_path: Path
) -> None:
    log = tmp_path / "notes.jsonl"
    await apply_agent(store, NOTES)
    run = await create_run(store, NOTES["name"], {})
    crashing = Serve(
        store.url,
        tmp_path / "serve.log",
        LANTERN_WORKER_ID="w1",
        LANTERN_TEST_CRASH_AFTER="step_completed:add",
        NOTES_LOG=str(log),
    )
    code = await asyncio.to_thread(crashing.proc.wait, 60)
    crashing.out.close()
    assert code == -9, crashing.output()
    assert completions(await store.events(run.id)) == {"start": 1, "add": 1}

    second = Serve(store.url, tmp_path / "serve.log", LANTERN_WORKER_ID="w1", NOTES_LOG=str(log))
    try:
        await wait_for_status(store, run.id, "succeeded", timeout=60)
    finally:
        second.stop()
    made = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(c["tool"], c["args"]) for c in made] == [("add", {"text": "x"})]  # once
    assert made[0]["meta"][KEY_META] == idempotency_key(run.id, "add", 1)
    final = await store.get_run(run.id)
    assert final is not None and final.output == {"n": 1}  # the journaled output, replayed
