"""The runs list, the key prompt, and the page shells, against a real `lantern serve`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from lantern.demo.receiver import Receiver
from tests.conftest import sqlite_url
from tests.server import Server, free_port
from tests.ui.browser import Tab, give_key
from tests.ui.test_waterfall import issue

SECRET_INPUT = "the-input-only-an-api-key-may-read"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Server, str]]:
    db = sqlite_url(tmp_path)
    server = Server(db, tmp_path / "serve.log").start()
    yield server, db
    server.stop()


def one_step(name: str, url: str) -> dict[str, object]:
    return {
        "name": name,
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {
                    "id": "post",
                    "type": "connector",
                    "data": {"connector": "http", "method": "POST", "url": url, "body": {}},
                },
            ],
            "edges": [{"source": "start", "target": "post"}],
        },
    }


def finished_runs(server: Server, key: str, receiver: Receiver) -> dict[str, str]:
    """One run that succeeds and one whose delivery is refused (nothing listens): id -> status."""
    closed = f"http://127.0.0.1:{free_port()}/nobody"
    found = {}
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}) as api:
        for name, url in (("ok", f"{receiver.url}/ok"), ("refused", closed)):
            api.put(f"/v1/agents/{name}", json=one_step(name, url)).raise_for_status()
            run = api.post("/v1/runs", json={"agentName": name, "input": {"s": SECRET_INPUT}})
            run_id = run.json()["id"]
            done = api.get(f"/v1/runs/{run_id}", params={"wait": 20}).json()
            found[run_id] = done["status"]
    assert sorted(found.values()) == ["failed", "succeeded"]
    return found


def test_the_key_prompt_explains_and_a_wrong_key_is_refused_clearly(
    served: tuple[Server, str], tab: Tab
) -> None:
    server, db = served
    page = tab.page
    page.goto(f"{server.url}/ui/runs")
    prompt = page.locator("#key-prompt")
    expect(prompt).to_be_visible()
    expect(prompt).to_contain_text("API key needed")
    expect(prompt).to_contain_text("runs:read")
    expect(page.locator("#page")).to_be_hidden()

    give_key(page, "lk_0123456789ab_not-a-real-secret")
    message = page.locator("#key-message")
    expect(message).to_have_text(
        "The server did not accept this key: unknown or revoked API key. "
        "Check the key and try again."
    )
    tab.screenshot("key-prompt-refused")
    expect(page.locator("#page")).to_be_hidden()

    give_key(page, issue(db, "agents:read"))
    expect(message).to_contain_text("this key lacks the 'runs:read' scope")
    assert page.evaluate("sessionStorage.length") == 0  # a refused key is never kept

    give_key(page, issue(db, "runs:read"))
    expect(page.locator("#page")).to_be_visible()
    expect(prompt).to_be_hidden()
    expect(page.locator("#runs-empty")).to_have_text("No runs.")

    page.reload()  # the key is kept for the session: no second prompt
    expect(page.locator("#page")).to_be_visible()
    page.get_by_role("button", name="Forget API key").click()
    expect(prompt).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0


def test_runs_list_filters_by_status_and_links_to_the_waterfall(
    served: tuple[Server, str], tab: Tab, receiver: Receiver
) -> None:
    server, db = served
    key = issue(db)
    runs = finished_runs(server, key, receiver)
    failed = next(r for r, status in runs.items() if status == "failed")
    page = tab.page
    page.goto(f"{server.url}/ui/runs")
    give_key(page, key)
    rows = page.locator("#runs-body tr")
    expect(rows).to_have_count(2)

    page.get_by_role("link", name="Failed").click()
    expect(page).to_have_url(f"{server.url}/ui/runs?status=failed")
    expect(page.get_by_role("link", name="Failed")).to_have_attribute("aria-current", "page")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-run", failed)
    expect(rows.first).to_contain_text("refused v1")
    expect(rows.first.locator(".status")).to_have_text("failed")

    page.get_by_role("link", name="Succeeded").click()
    expect(rows).to_have_count(1)
    expect(rows.first).not_to_have_attribute("data-run", failed)

    page.get_by_role("link", name="Cancelled").click()
    expect(page.locator("#runs-empty")).to_have_text("No runs with status cancelled.")

    page.get_by_role("link", name="Failed").click()
    page.get_by_role("link", name=failed).click()
    expect(page).to_have_url(f"{server.url}/ui/runs/{failed}")
    expect(page.locator("#run-status")).to_have_text("failed")  # no prompt: same session
    post = page.locator('.row[data-step="post"]')
    expect(post.locator(".bar.attempt.failed")).to_have_count(1)
    post.click()
    expect(page.locator("#details pre.error")).to_contain_text("connector")
    tab.screenshot("runs-failed-run")
    assert tab.errors == []

    page.goto(f"{server.url}/ui/runs/run_nobody")
    expect(page.locator("#page-message")).to_contain_text(
        "This run is gone (404: run run_nobody not found)."
    )
    expect(page.locator("#waterfall")).to_be_hidden()


def test_the_page_shells_carry_no_data_and_are_not_in_the_api_schema(
    served: tuple[Server, str], receiver: Receiver
) -> None:
    server, db = served
    runs = finished_runs(server, issue(db), receiver)
    run_id = next(iter(runs))
    with httpx.Client(base_url=server.url) as anonymous:
        shell = anonymous.get(f"/ui/runs/{run_id}")
        assert shell.status_code == 200
        assert shell.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in shell.headers["content-security-policy"]
        assert run_id in shell.text and SECRET_INPUT not in shell.text
        assert anonymous.get(f"/v1/runs/{run_id}").status_code == 401
        assert anonymous.get("/ui").headers["location"] == "/ui/runs"
        for name in ("run.js", "model.js", "api.js", "dom.js", "runs.js"):
            script = anonymous.get(f"/ui/static/{name}")
            assert script.status_code == 200
            assert "javascript" in script.headers["content-type"]
        assert (
            anonymous.get("/ui/static/lantern.css").headers["content-type"].startswith("text/css")
        )
        # A run id is text in the page, never markup.
        hostile = anonymous.get('/ui/runs/run_"><b>bold')
        assert hostile.status_code == 200
        assert "<b>bold" not in hostile.text and "run_&#34;&gt;&lt;b&gt;bold" in hostile.text
        bad = anonymous.get("/ui/runs", params={"status": "sideways"})
        assert bad.status_code == 422
        assert bad.headers["content-type"] == "application/problem+json"
        missing = anonymous.get("/ui/static/nothing.js")
        assert missing.status_code == 404
        paths = anonymous.get("/openapi.json").json()["paths"]
        assert paths and not [p for p in paths if p.startswith("/ui")]


def test_a_key_in_the_address_fragment_opens_the_page_without_the_prompt(
    served: tuple[Server, str], tab: Tab
) -> None:
    """`/ui/runs#key=...` (for a script or a screenshot): no form to fill, and the key is
    taken off the address at once, kept only in the tab's session as a typed one is."""
    server, db = served
    page = tab.page
    page.goto(f"{server.url}/ui/runs#key={issue(db)}")
    expect(page.locator("#runs-empty")).to_be_visible()
    expect(page.locator("#key-prompt")).to_be_hidden()
    expect(page).to_have_url(f"{server.url}/ui/runs")  # no fragment left to copy
    page.reload()  # the same session: no prompt
    expect(page.locator("#runs-empty")).to_be_visible()
    expect(page.locator("#key-prompt")).to_be_hidden()
    assert tab.errors == []
    page.goto("about:blank")  # a new load: a changed fragment alone loads nothing
    page.goto(f"{server.url}/ui/runs#key=lk_0123456789ab_not-a-real-secret")
    expect(page.locator("#key-prompt")).to_be_visible()  # a wrong one is refused as typed
