"""A large output read back in the run page, a deleted run's page, the schedules page and the
rate limits page, in headless Chromium against one real `lantern serve` shared by the module."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from playwright.sync_api import expect

from tests.api.test_outputs import BIG, NOOP, finish
from tests.conftest import sqlite_url
from tests.server import ALL_SCOPES, Server, make_key
from tests.ui.browser import Tab
from tests.ui.test_waterfall import api, issue

# The pages read the same REST API on either backend; the API tests cover both.
TICK = {"name": "tick", "graph": {"nodes": [{"id": "start", "type": "trigger"}], "edges": []}}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    tmp = tmp_path_factory.mktemp("ui-outputs")
    server = Server(sqlite_url(tmp), tmp / "serve.log").start()
    key = issue(server.database_url)
    yield server, key
    server.stop()


def test_a_large_output_shows_collapsed_with_its_size_and_a_deleted_run_says_it_is_gone(
    served: tuple[Server, str], tab: Tab
) -> None:
    server, key = served
    with api(server, key) as http:
        assert http.put("/v1/agents/noop", json=NOOP).status_code == 200
        run_id = finish(http, "noop", BIG)
        events = http.get(f"/v1/runs/{run_id}/events").json()["items"]
    stored = next(e["data"] for e in events if e["kind"] == "step_completed")
    size = f"{stored['outputBytes']:,} bytes"
    page = tab.page
    page.goto(f"{server.url}/ui/runs/{run_id}#key={key}")
    # Settled first: the summary gains rows as the page's reads land, and a click aimed while
    # the waterfall moves down can land beside its row (seen once in CI).
    expect(page.locator("#live")).to_contain_text("finished")
    apart = page.locator("#step-output-apart")
    # One click: a late read's redraw between its press and release keeps the row it pressed.
    page.locator('.row[data-step="start"]').click()
    expect(apart).to_contain_text(f"Stored apart from the event ({size}")
    page.get_by_role("button", name="show").click()
    block = page.locator("details#step-output-stored")
    expect(block.locator("summary")).to_have_text(
        f"Output ({size}, stored apart as {stored['outputRef']})"
    )
    expect(block).not_to_have_attribute("open", "")  # collapsed: 40 KiB is not poured out
    expect(page.locator("#step-output")).to_be_hidden()
    block.locator("summary").click()
    expect(page.locator("#step-output")).to_contain_text('"x": 7')
    shown = page.locator("#step-output").text_content() or ""
    assert "é" * 20 * 1024 in shown
    tab.screenshot("large-output-shown")
    assert tab.errors == []

    with api(server, key) as http:
        assert http.delete(f"/v1/runs/{run_id}").status_code == 204
    page.reload()
    expect(page.locator("#page-message")).to_have_text(
        re.compile(
            rf"^This run is gone \(404: run {run_id} not found\)\. A finished run is deleted"
        )
    )
    expect(page.locator("#key-prompt")).to_be_hidden()  # not the key's fault
    expect(page.locator("#waterfall")).to_be_hidden()  # no empty run drawn
    tab.screenshot("deleted-run")
    # The browser logs the 404 answer itself; nothing else went wrong in the page.
    assert [e for e in tab.errors if "404" not in e] == []


def test_schedules_list_their_next_fire_paused_state_and_recent_runs(
    served: tuple[Server, str], tab: Tab
) -> None:
    server, key = served
    with api(server, key) as http:
        assert http.put("/v1/agents/tick", json=TICK).status_code == 200
        nightly = {"agentName": "tick", "cron": "0 6 * * *", "timezone": "Europe/Paris"}
        assert http.put("/v1/schedules/nightly", json=nightly).status_code == 200
        runs: list[str] = []
        for _ in range(2):
            fired = http.post("/v1/schedules/nightly/trigger").json()["id"]
            assert (
                http.get(f"/v1/runs/{fired}", params={"wait": 20}).json()["status"] == "succeeded"
            )
            runs.insert(0, fired)  # newest first
        held = {"agentName": "tick", "every": "1h", "paused": True}
        assert http.put("/v1/schedules/weekly-held", json=held).status_code == 200
        next_fire = http.get("/v1/schedules/nightly").json()["nextFireAt"]
    page = tab.page
    page.goto(f"{server.url}/ui/schedules#key={key}")
    rows = page.locator("#schedules-body tr")
    expect(rows).to_have_count(2)
    row = page.locator('tr[data-schedule="nightly"]')
    expect(row).to_contain_text("0 6 * * * (Europe/Paris)")
    local = page.evaluate("iso => new Date(iso).toLocaleString()", next_fire)
    expect(row.locator(".next-fire")).to_have_text(local)
    expect(row.locator(".status.active")).to_have_text("active")
    recent = row.locator(".recent-runs li")
    expect(recent).to_have_count(2)
    assert [recent.nth(i).get_attribute("data-run") for i in range(2)] == runs
    expect(recent.first.locator(".status")).to_have_text("succeeded")
    paused = page.locator('tr[data-schedule="weekly-held"]')
    expect(paused).to_contain_text("every 1h")
    expect(paused.locator(".status.paused")).to_have_text("paused")
    expect(paused.locator(".next-fire")).to_have_text("none while paused")
    expect(paused).to_contain_text("none yet")
    tab.screenshot("schedules")
    assert tab.errors == []
    page.get_by_role("link", name=runs[1]).click()
    expect(page).to_have_url(f"{server.url}/ui/runs/{runs[1]}")
    expect(page.locator("#run-status")).to_have_text("succeeded")


SUMMARISE = {
    "name": "summarise",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {
                "id": "summary",
                "type": "ai-step",
                "data": {"model": "offline/echo", "prompt": "Summarise: hi", "maxTokens": 20},
            },
        ],
        "edges": [{"source": "start", "target": "summary"}],
    },
}


def test_limits_list_the_workspaces_and_the_servers_with_their_fill(
    served: tuple[Server, str], tab: Tab
) -> None:
    server = served[0]
    admin = issue(server.database_url, f"{ALL_SCOPES},admin")
    with ThreadPoolExecutor(1) as pool:  # an operator sets the server's limits
        operator = pool.submit(make_key, server.database_url, "ops", "", operator=True).result()
    with api(server, admin) as http, api(server, operator) as ops:
        tpm = {"match": {"model": "offline/*"}, "tokensPerMinute": 5000}
        assert http.put("/v1/limits/offline-tpm", json=tpm).status_code == 200
        fleet = {"match": {"model": "offline/*"}, "requestsPerMinute": 500, "scope": "server"}
        assert ops.put("/v1/limits/fleet", json=fleet).status_code == 200
        assert http.put("/v1/agents/summarise", json=SUMMARISE).status_code == 200
        run = http.post("/v1/runs", params={"wait": 20}, json={"agentName": "summarise"}).json()
        assert run["status"] == "succeeded", run
        shown = {x["name"]: x["used"] for x in http.get("/v1/limits").json()["items"]}
    tokens = shown["offline-tpm"]["tokens"]
    assert tokens > 0 and shown["fleet"] == {"tokens": tokens, "requests": 1}
    page = tab.page
    page.goto(f"{server.url}/ui/limits#key={admin}")
    expect(page.locator("#limits-body tr")).to_have_count(2)
    mine = page.locator('tr[data-limit="offline-tpm"]')
    expect(mine).to_contain_text("workspace")
    expect(mine.locator(".tokens")).to_have_text(f"{tokens:,} of 5,000")
    expect(mine.locator(".tokens meter")).to_have_attribute("value", str(tokens))
    expect(mine.locator(".requests")).to_have_text("1 (no limit)")
    server_row = page.locator('tr[data-limit="fleet"]')
    expect(server_row).to_contain_text("server")
    expect(server_row.locator(".requests")).to_have_text("1 of 500")
    tab.screenshot("limits")
    assert tab.errors == []
    with api(server, admin) as http, api(server, operator) as ops:  # the module's next tests
        assert http.delete("/v1/limits/offline-tpm").status_code == 204
        assert ops.delete("/v1/limits/fleet", params={"scope": "server"}).status_code == 204
    page.reload()
    expect(page.locator("#limits-empty")).to_be_visible()
