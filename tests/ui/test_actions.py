"""Acting on runs from the browser: approve (with a comment) and reject a parked run from its
waterfall and from the approvals page, cancel a running one, and buttons only for the key's
scopes. The runs are real, on a real `lantern serve`."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from tests.api.test_cli_operate import SLOW
from tests.api.test_operate import REVIEW
from tests.conftest import sqlite_url
from tests.helpers import wait_until
from tests.server import ALL_SCOPES, Server, make_key
from tests.ui.browser import Tab, give_key


def issue(db: str, scopes: str, name: str | None = None) -> str:
    # Playwright's sync API runs an event loop on this thread; asyncio.run needs its own.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(make_key, db, "default", scopes, name).result()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Server, httpx.Client]]:
    db = sqlite_url(tmp_path)
    server = Server(db, tmp_path / "serve.log").start()
    key = issue(db, ALL_SCOPES)
    api = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    for agent in (REVIEW, SLOW):
        api.put(f"/v1/agents/{agent['name']}", json=agent).raise_for_status()
    yield server, api
    api.close()
    server.stop()


def start(api: httpx.Client, agent: str, status: str, **input: str) -> str:
    run_id: str = api.post("/v1/runs", json={"agentName": agent, "input": input}).json()["id"]
    wait_until(lambda: api.get(f"/v1/runs/{run_id}").json()["status"] == status)
    return run_id


def test_a_parked_run_approved_from_its_page_resumes(
    served: tuple[Server, httpx.Client], tab: Tab
) -> None:
    server, api = served
    run_id = start(api, "review", "waiting", who="Ada")
    alice = issue(server.database_url, "runs:read,runs:approve,agents:read", "alice")

    page = tab.page
    page.goto(f"{server.url}/ui/runs/{run_id}")
    give_key(page, alice)
    form = page.locator('#actions .decision[data-node="ok"]')
    expect(form).to_contain_text("Refund Ada?")
    expect(page.locator("#cancel-run")).to_have_count(0)  # alice may not cancel
    form.get_by_label("Comment").fill("checked the order")
    form.get_by_role("button", name="Approve").click()

    expect(page.locator("#run-status")).to_have_text("succeeded", timeout=30_000)
    expect(page.locator("#actions")).to_be_hidden()
    wait = page.locator('.row[data-step="ok"] .bar.wait')
    alice_id = alice.split("_")[1]
    expect(wait).to_contain_text(f"approved by alice (key {alice_id})")
    run = api.get(f"/v1/runs/{run_id}").json()
    assert run["output"] == {"how": "approved", "by": "alice"}
    resumed = [
        e
        for e in api.get(f"/v1/runs/{run_id}/events").json()["items"]
        if e["kind"] == "step_resumed"
    ]
    assert resumed[0]["data"]["comment"] == "checked the order"
    tab.screenshot("actions-approved")
    assert tab.errors == []


def test_a_running_run_cancelled_from_its_page_stops(
    served: tuple[Server, httpx.Client], tab: Tab
) -> None:
    server, api = served
    run_id = start(api, "slow", "running")
    operator = issue(server.database_url, "runs:read,runs:execute,agents:read", "ops")

    page = tab.page
    page.goto(f"{server.url}/ui/runs/{run_id}")
    give_key(page, operator)
    expect(page.locator("#run-status")).to_have_text("running")
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator("#run-status")).to_have_text("cancelled", timeout=30_000)
    expect(page.locator("#cancel-run")).to_have_count(0)
    steps = {e["stepId"] for e in api.get(f"/v1/runs/{run_id}/events").json()["items"]}
    assert "after" not in steps  # the step after the one cancelled never started
    assert tab.errors == []


def test_the_approvals_page_lists_and_decides_and_a_reader_sees_no_buttons(
    served: tuple[Server, httpx.Client], tab: Tab
) -> None:
    server, api = served
    first = start(api, "review", "waiting", who="Ada")
    second = start(api, "review", "waiting", who="Bob")
    reader = issue(server.database_url, "runs:read,agents:read")

    page = tab.page
    page.goto(f"{server.url}/ui/approvals")
    give_key(page, reader)
    rows = page.locator("#approvals-body tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("Refund Ada?")
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    page.goto(f"{server.url}/ui/runs/{first}")
    expect(page.locator("#actions")).to_contain_text("lacks the runs:approve scope")
    expect(page.locator("#cancel-run")).to_have_count(0)

    page.get_by_role("button", name="Forget API key").click()
    expect(page.locator("#key-prompt")).to_be_visible()  # the page reloaded without a key
    give_key(page, issue(server.database_url, "runs:read,runs:approve,agents:read", "bob"))
    expect(page.locator(".decision")).to_be_visible()  # the key is accepted (and kept)
    page.goto(f"{server.url}/ui/approvals")
    row = page.locator(f'#approvals-body tr[data-run="{second}"]')
    row.get_by_label("Comment").fill("not this one")
    row.get_by_role("button", name="Reject").click()
    expect(rows).to_have_count(1)
    expect(page.locator(f'#approvals-body tr[data-run="{first}"]')).to_be_visible()
    run = api.get(f"/v1/runs/{second}", params={"wait": 30}).json()
    assert run["status"] == "failed" and "rejected by bob: not this one" in run["error"]["message"]
    assert tab.errors == []
