"""Headless Debian Chromium driven by Playwright, with nothing downloaded.

The browser is the system's /usr/bin/chromium (`make test` installs it with apt-get). Each page
records its console errors and uncaught exceptions, so a test can assert there were none, and
screenshots go to test-artifacts/ (gitignored) for a person to look at.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Error, Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"


# Module scope, not session: between its calls Playwright's sync API marks its own event loop as
# running in this thread, so an async test that the same xdist worker runs next, from another
# module, would find "another loop is running". Pytest tears a module's fixtures down before the
# next module's first test, which stops Playwright and clears the mark.
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        reason = f"{CHROMIUM} is not installed (make test installs it: apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI never skips the browser tests")
        pytest.skip(reason)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield chromium
        chromium.close()


@dataclass
class Tab:
    """A page and what went wrong in it."""

    page: Page
    errors: list[str] = field(default_factory=list)

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def tab(browser: Browser) -> Iterator[Tab]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    found = Tab(page)

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            found.errors.append(f"console: {message.text} ({message.location.get('url')})")

    def on_error(error: Error) -> None:
        found.errors.append(f"page error: {error.message}")

    page.on("console", on_console)
    page.on("pageerror", on_error)
    yield found
    context.close()


def give_key(page: Page, key: str) -> None:
    """Answer the page's key prompt as a person would."""
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Use this key").click()
