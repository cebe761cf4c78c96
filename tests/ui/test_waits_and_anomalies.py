"""Waits (a sub-agent, an approval), an anomaly and the offline label on the waterfall, from a
real run parked at an approval and approved over the API while the page watches."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from playwright.sync_api import expect

from tests.conftest import sqlite_url
from tests.helpers import wait_until
from tests.server import Server
from tests.ui.browser import Tab, give_key
from tests.ui.test_waterfall import issue

LEAF = {
    "name": "leaf",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "hello", "type": "tool", "data": {"tool": "noop", "args": {}}},
        ],
        "edges": [{"source": "start", "target": "hello"}],
    },
}
# The test app's noop tool returns its arguments, so "draft" answers as the offline model
# provider does; the page labels any step whose output says so.
REVIEW = {
    "name": "review",
    "anomalies": {"excessive_steps": {"maxSteps": 3, "policy": "record"}},
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {
                "id": "draft",
                "type": "tool",
                "data": {"tool": "noop", "args": {"provider": "offline", "text": "Hi"}},
            },
            {"id": "child", "type": "subagent", "data": {"agentName": "leaf", "input": {}}},
            {"id": "ok", "type": "approval", "data": {"prompt": "Send it to {{ input.name }}?"}},
            {
                "id": "send",
                "type": "tool",
                "data": {"tool": "noop", "args": {"how": "{{ steps.ok.output.decision }}"}},
            },
        ],
        "edges": [
            {"source": "start", "target": "draft"},
            {"source": "draft", "target": "child"},
            {"source": "child", "target": "ok"},
            {"source": "ok", "target": "send"},
        ],
    },
}


def test_a_parked_run_shows_its_waits_and_updates_when_approved(tmp_path: Path, tab: Tab) -> None:
    db = sqlite_url(tmp_path)
    key = issue(db)
    server = Server(db, tmp_path / "serve.log").start()
    try:
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as api:
            for agent in (LEAF, REVIEW):
                api.put(f"/v1/agents/{agent['name']}", json=agent).raise_for_status()
            run_id = api.post("/v1/runs", json={"agentName": "review", "input": {"name": "Ada"}})
            run_id = run_id.json()["id"]
            wait_until(lambda: api.get(f"/v1/runs/{run_id}").json()["status"] == "waiting")

            page = tab.page
            page.goto(f"{server.url}/ui/runs/{run_id}")
            give_key(page, key)
            expect(page.locator("#run-status")).to_have_text("waiting")
            expect(page.locator("#live")).to_contain_text("live")
            ok = page.locator('.row[data-step="ok"]')
            child = page.locator('.row[data-step="child"]')
            expect(ok.locator(".status")).to_have_text("waiting")
            expect(ok.locator(".bar.wait.open")).to_have_text("waiting for approval")
            expect(child.locator(".bar.wait:not(.open)")).to_have_text("waiting for sub-agent")
            expect(page.locator('.row[data-step="draft"] .badge')).to_have_text(["offline"])
            page.evaluate("window.notReloaded = true")
            # A click whose press and release straddle a redraw (the page redraws every second
            # while a run is live) still selects its step: the row is kept, not rebuilt.
            row = '.row[data-step="draft"]'
            name = page.locator(f"{row} .name strong")
            name.scroll_into_view_if_needed()
            box = name.bounding_box()
            assert box is not None
            page.mouse.move(box["x"] + 2, box["y"] + box["height"] / 2)
            page.evaluate(f"window.pressed = document.querySelector('{row}')")
            page.mouse.down()
            page.wait_for_timeout(1300)
            page.mouse.up()
            expect(page.locator("#details")).to_contain_text("Made by the offline model provider")
            assert page.evaluate(f"window.pressed === document.querySelector('{row}')")

            decided = api.post(
                f"/v1/runs/{run_id}/approvals/ok",
                json={"decision": "approve", "comment": "looks right"},
            )
            assert decided.status_code == 202, decided.text

        expect(page.locator("#run-status")).to_have_text("succeeded")
        expect(ok.locator(".bar.wait.open")).to_have_count(0)
        expect(ok.locator(".status")).to_have_text("completed")
        expect(page.locator('.row[data-step="send"] .status')).to_have_text("completed")
        assert page.evaluate("window.notReloaded") is True
        expect(page.locator("#anomaly-list li")).to_have_count(1)
        expect(page.locator("#anomaly-list li")).to_contain_text(
            "excessive steps: 4 step attempts (limit 3); recorded"
        )
        expect(page.locator(".anomaly-line")).to_have_count(1)

        ok.click()
        details = page.locator("#details")
        expect(details).to_contain_text("for approval: “Send it to Ada?”; approved by key ")
        expect(details).to_contain_text("(“looks right”)")
        page.locator('.row[data-step="draft"]').click()
        expect(details).to_contain_text("Made by the offline model provider")
        tab.screenshot("waterfall-waits-and-anomaly")
        child.click()
        link = details.get_by_role("link", name=re.compile("^run_"))
        expect(details).to_contain_text("the child run succeeded")
        child_id = link.inner_text()
        expect(page.locator("#children a")).to_have_text([child_id])
        link.click()
        expect(page).to_have_url(f"{server.url}/ui/runs/{child_id}")
        expect(page.locator("#run-status")).to_have_text("succeeded")
        expect(page.locator('.row[data-step="hello"] .status')).to_have_text("completed")
        page.get_by_role("link", name=run_id).click()  # back up to the parent
        expect(page).to_have_url(f"{server.url}/ui/runs/{run_id}")
        assert tab.errors == []
    finally:
        server.stop()
