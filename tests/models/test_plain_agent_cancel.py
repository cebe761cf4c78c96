"""Cancelling a plain agent's run in a tool call: an async tool is cancelled at once, a sync
tool (a thread) is waited for and the run stops at its return, journaled as such."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import lantern
from lantern.engine.cancel import cancel_run
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.store import Store
from tests.fake_llm import FakeProvider, Script
from tests.integration.test_run_control import until

entered = threading.Event()
interrupted: list[str] = []


def app() -> lantern.App:
    a = lantern.App()

    @a.tool("wait.async")
    async def wait_async() -> dict[str, Any]:
        """Wait a long time."""
        entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            interrupted.append("async")
            raise
        return {}

    @a.tool("wait.sync")
    def wait_sync() -> dict[str, Any]:
        """Wait a while, in a thread."""
        entered.set()
        time.sleep(1.5)
        return {"slept": True}

    return a


@pytest.fixture
async def worker(store: Store, fake: FakeProvider) -> AsyncIterator[Worker]:
    async with Worker(store, app(), worker_id="w1", lease_ttl=60, poll_interval=0.05) as w:
        task = asyncio.create_task(w.serve())
        yield w
        await w.stop(grace=3)
        await task


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_cancel_in_a_tool_call(
    store: Store, fake: FakeProvider, worker: Worker, kind: str
) -> None:
    fake.script = Script([[(f"wait_{kind}", {})], "never reached"])
    name = f"waiter-{kind}"
    await apply_agent(store, {"name": name, "model": "claude-haiku-4-5", "tools": [f"wait.{kind}"]})
    entered.clear()
    interrupted.clear()
    run = await create_run(store, name, "wait please")
    if not await asyncio.to_thread(entered.wait, 30):
        stored = await store.get_run(run.id)
        raise AssertionError(f"the tool never started: {stored}")
    asked = time.monotonic()
    await cancel_run(store, run.id, "api", 60)
    done = await until(store, run.id, "cancelled", "succeeded", "failed", timeout=10)
    assert done.status == "cancelled"
    events = await store.events(run.id)
    assert events[-1].kind == "run_cancelled"
    tool_step = next(
        e.step_id for e in events if e.kind == "step_started" and e.data.get("type") == "tool"
    )
    assert len(fake.calls()) == 1, "no model turn after the cancel"
    if kind == "async":
        assert time.monotonic() - asked < 5
        assert interrupted == ["async"]
        assert "uninterruptible" not in events[-1].data
    else:
        assert ("step_completed", tool_step) in [(e.kind, e.step_id) for e in events]
        assert events[-1].data["uninterruptible"] == [tool_step]
