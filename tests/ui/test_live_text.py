"""The waterfall page follows the run's stream: a model step's text grows live in its detail
panel while the model writes it, and the page needs no reload or polling to show the end."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import expect

from tests.server import Server
from tests.ui.browser import Tab, give_key
from tests.ui.test_waterfall import api, db, key, row

__all__ = ["db", "key"]  # the fixtures, shared with the waterfall tests

WORDS = " ".join(f"word{i}" for i in range(40))
AGENT = {
    "name": "writer",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "ok", "type": "approval", "data": {"prompt": "Write it?"}},
            {
                "id": "draft",
                "type": "ai-step",
                "data": {"model": "offline/echo", "prompt": "{{ input.text }}"},
            },
        ],
        "edges": [{"source": "start", "target": "ok"}, {"source": "ok", "target": "draft"}],
    },
}


def test_a_model_steps_text_grows_live_in_its_detail_panel(
    db: str, key: str, tmp_path: Path, tab: Tab
) -> None:
    env = {"LANTERN_OFFLINE_WORD_DELAY": "100ms"}
    server = Server(db, tmp_path / "serve.log", env=env).start()
    try:
        with api(server, key) as client:
            client.put("/v1/agents/writer", json=AGENT).raise_for_status()
            created = client.post(
                "/v1/runs", json={"agentName": "writer", "input": {"text": WORDS}}
            )
            run_id = created.json()["id"]
            page = tab.page
            page.goto(f"{server.url}/ui/runs/{run_id}")
            give_key(page, key)
            expect(page.locator("#run-status")).to_have_text("waiting")
            page.evaluate("window.notReloaded = true")
            client.post(f"/v1/runs/{run_id}/approvals/ok", json={"decision": "approve"})
            row(page, "draft").click()  # the row appears from the stream; open its panel
            live = page.locator("#live-text")
            expect(live).to_contain_text("word0 word1")
            partial = live.inner_text()
            assert partial and len(partial) < len(WORDS)  # mid-answer
            tab.screenshot("waterfall-live-text")
            expect(live).to_contain_text("word30")  # it grew, in the same element
            assert live.inner_text().startswith(partial)
            expect(page.locator("#run-status")).to_have_text("succeeded")
            expect(page.locator("#step-output")).to_contain_text(WORDS)  # the journal's text
            expect(page.locator("#live-text")).to_have_count(0)
            assert page.evaluate("window.notReloaded") is True
    finally:
        server.stop()
    assert tab.errors == []
