"""Waits, anomalies and the offline provider on the waterfall.

Approval and sub-agent nodes, anomaly detection and model calls have not landed in the engine
yet, so no run can journal these events today. This test writes the journal they will write
(CONTRACT §7 kinds, through the real store and its EventWriter, hash chain included) and
checks that the page draws it; when those nodes land, their own runs replace this journal.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from playwright.sync_api import expect

from lantern.engine.journal import EventWriter
from lantern.engine.runs import apply_agent, create_run
from lantern.store import open_store
from lantern.store.records import Append, RunUpdate
from tests.conftest import sqlite_url
from tests.server import Server
from tests.ui.browser import Tab, give_key
from tests.ui.test_waterfall import issue

AGENT = {
    "name": "review",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "draft", "type": "tool", "data": {"tool": "noop", "args": {}}},
            {"id": "ask", "type": "tool", "data": {"tool": "noop", "args": {}}},
        ],
        "edges": [{"source": "start", "target": "draft"}, {"source": "draft", "target": "ask"}],
    },
}
OFFLINE_OUTPUT = {"text": "Welcome, Ada", "provider": "offline", "model": "offline/echo"}
ANOMALY = {"kind": "tool_loop", "message": "the same tool was called 5 times with one input"}


async def journal(db: str) -> str:
    store = open_store(db)
    await store.open()
    try:
        await apply_agent(store, AGENT)
        run = await create_run(store, "review", {"name": "Ada"})
        lease = await store.acquire_lease(run.id, "writer", ttl=60)
        assert lease is not None
        w = EventWriter(run.id)

        async def commit(*events: object, update: RunUpdate | None = None) -> None:
            await store.append(Append(lease, tuple(events), update))  # type: ignore[arg-type]
            await asyncio.sleep(0.08)  # time passes between commits, as in a real run

        await commit(
            w.event("run_started", {"worker": "writer"}),
            w.event("step_started", {"type": "trigger"}, step_id="start", attempt=1),
            w.completed("start", 1, {"name": "Ada"}),
            w.event("step_started", {"type": "tool"}, step_id="draft", attempt=1),
            update=RunUpdate("running"),
        )
        await commit(
            w.completed("draft", 1, OFFLINE_OUTPUT),
            w.event("step_started", {"type": "tool"}, step_id="ask", attempt=1),
        )
        await commit(w.event("step_waiting", {"reason": "approval"}, step_id="ask", attempt=1))
        await asyncio.sleep(0.2)
        await commit(w.event("step_resumed", {"decision": "approve"}, step_id="ask", attempt=1))
        await commit(
            w.event("anomaly_detected", ANOMALY, step_id="ask", attempt=1),
            w.completed("ask", 1, {"approved": True}),
            w.event("run_succeeded", {"output": {"approved": True}}),
            update=RunUpdate("succeeded", output={"approved": True}),
        )
        return run.id
    finally:
        await store.close()


def test_waits_anomalies_and_the_offline_provider_are_drawn(tmp_path: Path, tab: Tab) -> None:
    db = sqlite_url(tmp_path)
    with ThreadPoolExecutor(1) as pool:  # Playwright's loop owns this thread
        run_id = pool.submit(asyncio.run, journal(db)).result()
    key = issue(db)
    server = Server(db, tmp_path / "serve.log").start()
    try:
        page = tab.page
        page.goto(f"{server.url}/ui/runs/{run_id}")
        give_key(page, key)
        expect(page.locator("#run-status")).to_have_text("succeeded")
        draft = page.locator('.row[data-step="draft"]')
        ask = page.locator('.row[data-step="ask"]')
        expect(draft.locator(".badge")).to_have_text(["offline"])
        wait = ask.locator(".bar.wait")
        expect(wait).to_have_text("waiting for approval")
        width = wait.evaluate("b => parseFloat(b.style.width)")
        assert 5 < width < 80, width  # 0.28 s of a run of about half a second
        expect(ask.locator(".badge")).to_have_text(["⚠ anomaly"])
        expect(ask.locator(".marker.anomaly")).to_have_count(1)
        expect(page.locator("#anomalies")).to_be_visible()
        expect(page.locator("#anomaly-list li")).to_contain_text(["ask: " + ANOMALY["message"]])
        draft.click()
        expect(page.locator("#details")).to_contain_text("offline model provider")
        expect(page.locator("#step-output")).to_contain_text('"provider": "offline"')
        tab.screenshot("waterfall-wait-and-anomaly")
        assert tab.errors == []
    finally:
        server.stop()
