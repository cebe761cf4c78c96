"""The run waterfall page in headless Chromium, against real `lantern serve` processes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Locator, Page, expect

from lantern.demo.receiver import Receiver
from lantern.ids import idempotency_key
from tests.conftest import sqlite_url
from tests.helpers import http_chain
from tests.server import ALL_SCOPES, Server, make_key
from tests.ui.browser import Tab, give_key

# The page reads the same journal on either backend; the store tests cover both.


@pytest.fixture
def db(tmp_path: Path) -> str:
    return sqlite_url(tmp_path)


def issue(db: str, scopes: str = ALL_SCOPES, workspace: str = "default") -> str:
    # Playwright's sync API runs an event loop on this thread; asyncio.run needs its own.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(make_key, db, workspace, scopes).result()


@pytest.fixture
def key(db: str) -> str:
    return issue(db)


def api(server: Server, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


RETRY = {"maxAttempts": 3, "backoffMs": 300, "retryableClasses": ["connector"]}


def start_chain(
    client: httpx.Client, receiver: Receiver, steps: int, held: str, retry_s1: bool = False
) -> str:
    """Apply an http chain of ``steps`` steps, hold ``held`` at the receiver, start a run.

    With ``retry_s1``, s1 has a retry policy and the receiver answers its first request 503.
    """
    agent = http_chain("chain", receiver.url, steps)
    if retry_s1:
        agent["graph"]["nodes"][1]["data"]["retry"] = RETRY
        receiver.fail("/s1", 503, 1)
    client.put("/v1/agents/chain", json=agent).raise_for_status()
    receiver.hold(held)
    created = client.post("/v1/runs", json={"agentName": "chain", "input": {"n": 1}})
    assert created.status_code == 202, created.text
    assert receiver.arrived.wait(20)
    run_id: str = created.json()["id"]
    return run_id


def row(page: Page, step: str) -> Locator:
    return page.locator(f'.row[data-step="{step}"]')


@pytest.fixture
def crashed_run(
    db: str, key: str, tmp_path: Path, receiver: Receiver
) -> Iterator[tuple[Server, str]]:
    """A four-step http chain whose s1 fails once with a 503 and is retried, and whose server
    is SIGKILLed while s3's request is in flight, then restarted with the same worker id: s1
    and s2 are replayed, s3 re-runs with the same key."""
    env = {"LANTERN_WORKER_ID": "ui-1"}
    first = Server(db, tmp_path / "serve.log", env=env).start()
    with api(first, key) as client:
        run_id = start_chain(client, receiver, 4, "/s3", retry_s1=True)
    first.kill()
    receiver.release()
    second = Server(db, tmp_path / "serve.log", env=env).start()
    try:
        with api(second, key) as client:
            run = client.get(f"/v1/runs/{run_id}", params={"wait": 20}).json()
            assert run["status"] == "succeeded", run
        yield second, run_id
    finally:
        second.stop()


def ms(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp() * 1000


def extent(locator: Locator) -> tuple[float, float]:
    """Where a bar is drawn, in percent of the run's span: (start, end). Pixels would not do:
    a bar of a few milliseconds is drawn wider than its time, so it can be seen."""
    left, width = locator.evaluate("b => [parseFloat(b.style.left), parseFloat(b.style.width)]")
    return left, left + width


def test_a_run_with_a_retry_and_a_crash_shows_attempts_backoff_replays_and_the_rerun(
    crashed_run: tuple[Server, str], key: str, tab: Tab, receiver: Receiver
) -> None:
    server, run_id = crashed_run
    page = tab.page
    page.goto(f"{server.url}/ui/runs/{run_id}")
    give_key(page, key)

    expect(page.locator("#run-status")).to_have_text("succeeded")
    expect(page.locator(".row")).to_have_count(5)  # the trigger and s1..s4
    for step in ("s1", "s2"):
        expect(row(page, step).locator(".marker.replay")).to_have_count(1)
    expect(row(page, "s2").locator(".badge")).to_have_text(["replayed"])

    # s1: attempt 1 failed with the 503, a backoff, then attempt 2 completed; all replayed.
    s1 = row(page, "s1")
    expect(s1.locator(".badge")).to_have_text(["replayed", "2 attempts"])
    expect(s1.locator(".bar.attempt")).to_have_count(2)
    first, backoff = s1.locator(".bar.attempt.retrying"), s1.locator(".bar.backoff")
    second = s1.locator(".bar.attempt.completed")
    expect(first).to_have_attribute("data-attempt", "1")
    expect(second).to_have_attribute("data-attempt", "2")
    expect(backoff).to_have_attribute("title", re.compile(r"before attempt 2 of 3$"))
    one, gap, two = extent(first), extent(backoff), extent(second)
    assert one[1] <= gap[0] + 0.01 and gap[1] <= two[0] + 0.01
    # Drawn to scale: the backoff's share of the track is its share of the run's time.
    with api(server, key) as client:
        events = client.get(f"/v1/runs/{run_id}/events").json()["items"]
    at = {(e["kind"], e["stepId"], e["attempt"]): ms(e["at"]) for e in events}
    retried, resumed = at[("step_retrying", "s1", 2)], at[("step_started", "s1", 2)]
    assert resumed - retried >= 150  # the jittered 300 ms backoff was waited out
    span = ms(events[-1]["at"]) - ms(events[0]["at"])
    assert abs((gap[1] - gap[0]) / 100 - (resumed - retried) / span) < 0.005
    s1.click()
    details = page.locator("#details")
    expect(details).to_contain_text("Retried: Attempt 1 failed")
    expect(details).to_contain_text("503")
    sent = [h.idempotency_key for h in receiver.hits if h.path == "/s1"]
    assert sent == [idempotency_key(run_id, "s1", n) for n in (1, 2)]
    for n, sent_key in enumerate(sent, start=1):
        assert sent_key is not None
        expect(details.locator(f'td[data-attempt="{n}"]')).to_have_text(sent_key)
    s3 = row(page, "s3")
    expect(s3.locator(".badge")).to_have_text(["re-run, same key"])
    # One attempt drawn in two pieces: cut off by the crash, then re-run after the recovery.
    expect(s3.locator(".bar.attempt")).to_have_count(2)
    expect(s3.locator(".bar.attempt.cut")).to_have_attribute("data-attempt", "1")
    expect(s3.locator(".bar.attempt.completed.rerun")).to_have_attribute("data-attempt", "1")
    expect(row(page, "s4").locator(".badge")).to_have_count(0)
    expect(row(page, "s4").locator(".bar.attempt.completed")).to_have_count(1)
    band = page.locator(".band.crash")
    expect(band).to_have_count(1)
    expect(band).to_contain_text("crash → recovered by ui-1")
    # The band sits between s2's end and s3's re-run: left of the re-run bar, right of s2.
    gap_start, gap_end = extent(band)
    assert extent(row(page, "s2").locator(".bar.attempt"))[1] <= gap_start + 0.01
    assert gap_end <= extent(s3.locator(".bar.rerun"))[0] + 0.01
    # s3's first piece runs from its start into the gap: its end is not journaled.
    cut = extent(s3.locator(".bar.cut"))
    assert cut[0] <= gap_start + 0.01 and abs(cut[1] - gap_end) < 0.01
    # The bands and the bars share one geometry: the band covers the same pixels.
    band_box, cut_box = band.bounding_box(), s3.locator(".bar.cut").bounding_box()
    assert band_box and cut_box
    assert abs(band_box["x"] + band_box["width"] - (cut_box["x"] + cut_box["width"])) <= 2

    s3.click()
    expect(details).to_be_visible()
    expected = idempotency_key(run_id, "s3", 1)
    assert receiver.keys("/s3") == {expected}  # what the receiver saw, both times
    expect(details.locator('td[data-attempt="1"]')).to_have_text(expected)
    expect(details).to_contain_text("Re-run, same key")
    expect(details.locator("#step-definition")).to_contain_text(f"{receiver.url}/s3")
    expect(details.locator("#step-output")).to_contain_text('"received"')
    expect(details.locator("table.events")).to_contain_text("step_started")
    expect(details.locator("table.events")).to_contain_text("step_completed")
    expect(page.locator("#live")).to_contain_text("finished")
    tab.screenshot("waterfall-retry-and-crash")
    assert tab.errors == []


def test_live_run_updates_without_reload(
    db: str, key: str, tmp_path: Path, receiver: Receiver, tab: Tab
) -> None:
    server = Server(db, tmp_path / "serve.log").start()
    try:
        with api(server, key) as client:
            run_id = start_chain(client, receiver, 3, "/s2")
        page = tab.page
        page.goto(f"{server.url}/ui/runs/{run_id}")
        give_key(page, key)
        expect(page.locator("#run-status")).to_have_text("running")
        expect(page.locator("#live")).to_contain_text("live")
        expect(row(page, "s1").locator(".status")).to_have_text("completed")
        expect(row(page, "s2").locator(".status")).to_have_text("in flight")
        expect(row(page, "s3")).to_have_count(0)
        # The in-flight bar grows with the clock while nothing is journaled.
        width = row(page, "s2").locator(".bar").evaluate("b => b.style.width")
        page.evaluate("window.notReloaded = true")
        tab.screenshot("waterfall-live-run")
        expect(row(page, "s2").locator(".bar")).not_to_have_attribute(
            "style", re.compile(rf"width: {re.escape(width)}")
        )

        receiver.release()
        expect(page.locator("#run-status")).to_have_text("succeeded")
        expect(row(page, "s2").locator(".status")).to_have_text("completed")
        expect(row(page, "s3").locator(".status")).to_have_text("completed")
        expect(page.locator("#live")).to_contain_text("finished")
        assert page.evaluate("window.notReloaded") is True
        assert tab.errors == []
    finally:
        server.stop()
