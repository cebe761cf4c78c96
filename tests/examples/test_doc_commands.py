"""Every shell command the docs give against a server runs, as written, against a real one.

Which blocks run: a fenced block tagged ``sh`` is what a reader types into a terminal. One that
talks to a server (a ``curl`` line, ``$LANTERN_URL``, or a ``lantern`` command of the API:
``run``, ``runs``, ``agents``, ``approvals``, ``schedules``, ``limits``, ``receipt``,
``journal``) is run.
Untagged blocks are synopses with placeholders (``RUN_ID``, ``NODE``) and ``console`` blocks
show a session's output; neither is run. The pages in ``NOT_RUN`` are walked through by a test of
their own, named there.

The environment a reader has: the clone's folder (``examples/`` and ``.venv/`` are there), the
server the page starts on 127.0.0.1:8787 (here one ``lantern serve`` on a free port, which
``8787`` in the commands is turned into), ``LANTERN_DATABASE_URL`` of that server (for
``lantern keys create``; a page's own ``export LANTERN_DATABASE_URL=`` names that server's
database, so it is not run), and ``LANTERN_URL`` / ``LANTERN_API_KEY`` of a reader who did the
tutorial. A ``lantern serve`` line is that server: it is not run, but the module its ``--app``
names (the page's python block that makes ``app = lantern.App()``) is loaded into it, and its
``VAR=value`` prefixes are its environment. ``curl`` fails on an HTTP error, as a reader would
notice one. A page's blocks run in order in one bash (``set -euo pipefail``), so a variable one
block sets is there in the next; a failure names the page and the line of its command.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.server import ALL_SCOPES, LANTERN, ROOT, Server, make_key

PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
API_COMMANDS = "run|runs|agents|approvals|schedules|limits|receipt|journal"
TALKS_TO_SERVER = re.compile(
    rf"(^|[\s;&|(]|\$\()(curl\s|(\S*/)?lantern\s+({API_COMMANDS})\b)|\$LANTERN_URL|LANTERN_URL=",
    re.M,
)
SERVE = re.compile(r"^((?:\w+=\S+\s+)*)(?:\S*/)?lantern\s+serve\b(.*?)&?\s*$")
SETS_LIMIT = re.compile(r"PUT\b.*?/v1/limits/|lantern\s+limits\s+set\b")
OWN_DATABASE = re.compile(r"^\s*export\s+LANTERN_DATABASE_URL=")
NOT_RUN = {
    # Two terminals, a slow receiver and a SIGKILL by hand: the walk-through is driven with
    # the page's own files and commands by tests/examples/test_examples.py
    # (test_the_tutorial_as_written_approves_cancels_and_retries).
    "docs/tutorial.md": "test_the_tutorial_as_written_approves_cancels_and_retries",
    # Starts a runtime node (a long-lived process) and needs the drivers of the microVM tier:
    # tests/runtime/ run `lantern node`, `runtime check` and `runtime vms|nodes`.
    "docs/runtime.md": "tests/runtime",
}


@dataclass
class Block:
    page: str  # relative to the clone
    line: int  # of the first command line in the page
    lang: str
    lines: list[str]


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^\s*```(\S*)", lines[i])
        i += 1
        if not fence:
            continue
        start, body = i, []
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        found.append(Block(str(page.relative_to(ROOT)), start + 1, fence.group(1), body))
    return found


def runnable(block: Block) -> bool:
    return block.lang == "sh" and bool(TALKS_TO_SERVER.search("\n".join(block.lines)))


def app_modules(page_blocks: list[Block], folder: Path) -> tuple[list[str], list[Path]]:
    """The modules the page's ``lantern serve --app MODULE:app`` lines name, and the folders
    they are imported from: ``--app-dir DIR`` of the clone, or else the page's last python
    block before that line that makes an App, saved as MODULE.py in ``folder``."""
    modules, folders = [], []
    for n, block in enumerate(page_blocks):
        for line in block.lines:
            serve = SERVE.match(line.strip())
            app = re.search(r"--app\s+(\w+):app\b", line)
            if not serve or not app:
                continue
            modules.append(app.group(1))
            app_dir = re.search(r"--app-dir\s+(\S+)", line)
            if app_dir:
                found = ROOT / app_dir.group(1)
                assert (found / f"{app.group(1)}.py").exists(), f"{block.page}:{block.line}"
                folders.append(found)
                continue
            sources = [
                b
                for b in page_blocks[:n]
                if b.lang == "python" and "lantern.App()" in "\n".join(b.lines)
            ]
            assert sources, f"{block.page}:{block.line}: no python block makes {app.group(1)}'s App"
            (folder / f"{app.group(1)}.py").write_text("\n".join(sources[-1].lines) + "\n")
    return modules, folders


def serve_env(block: Block) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in block.lines:
        serve = SERVE.match(line.strip())
        if serve:
            env |= dict(word.split("=", 1) for word in shlex.split(serve.group(1)))
    return env


def script(page_blocks: list[Block], port: int) -> tuple[str, list[int]]:
    """A page's runnable blocks as one bash script, and the page line of each script line."""
    out = ["set -euo pipefail", "trap 'echo \"failed at script line $LINENO\" >&2' ERR"]
    where = [0, 0]
    for block in page_blocks:
        if not runnable(block):
            continue
        for offset, line in enumerate(block.lines):
            # The page's server is the test's, on the test's database: its start and the
            # database it names are no-ops that keep the numbering.
            ours = SERVE.match(line.strip()) or OWN_DATABASE.match(line)
            out.append(":" if ours else line.replace("8787", str(port)))
            where.append(block.line + offset)
    return "\n".join(out) + "\n", where


def run_order(pages: dict[str, list[Block]]) -> list[str]:
    """The pages by name, those that set a rate limit last. Every page works in the server's
    ``default`` workspace, and a limit a page leaves there (docs/rate-limits.md holds offline
    models to 3 requests a minute) would hold each later page's model runs for up to a minute."""

    def sets_limit(page: str) -> bool:
        return any(runnable(b) and SETS_LIMIT.search("\n".join(b.lines)) for b in pages[page])

    return sorted(pages, key=lambda page: (sets_limit(page), page))


def merged_app(modules: list[str]) -> str:
    """One App holding the agents, tools and MCP servers of every page's module."""
    return f"""\
import importlib

import lantern

app = lantern.App()
for name in {modules!r}:
    page = importlib.import_module(name).app
    app.agents.update(page.agents)
    app.tools.update(page.tools)
    app.mcp_servers.update(page.mcp_servers)
    app.only_in.update(page.only_in)
"""


def curl_that_fails_on_http_errors(folder: Path) -> Path:
    """A ``curl`` first on PATH that exits non-zero on a 4xx or 5xx, printing the problem."""
    real = shutil.which("curl")
    assert real, "curl is not installed"
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "curl"
    wrapper.write_text(f'#!/bin/sh\nexec {real} -sS --fail-with-body "$@"\n')
    wrapper.chmod(0o755)
    return bin_dir


# One server and about twenty CLI commands: on a loaded machine more than the suite's 120 s.
@pytest.mark.timeout(300)
def test_the_docs_server_commands_run_as_written(tmp_path: Path) -> None:
    by_page = {str(p.relative_to(ROOT)): blocks(p) for p in PAGES}
    for page, test in NOT_RUN.items():  # an exclusion that no longer excludes anything goes
        assert any(runnable(b) for b in by_page[page]), f"{page} has no server commands now"
        assert (
            test in (ROOT / "tests/examples/test_examples.py").read_text() or (ROOT / test).exists()
        )
    pages = {p: bs for p, bs in by_page.items() if p not in NOT_RUN and any(map(runnable, bs))}
    assert len(pages) >= 4, sorted(pages)  # the parser still finds the pages it should

    apps = tmp_path / "apps"
    apps.mkdir()
    modules: list[str] = []
    folders = [apps]
    for page_blocks in pages.values():
        named, where = app_modules(page_blocks, apps)
        modules += named
        folders += where
    (apps / "docs_app.py").write_text(merged_app(modules))
    env = {k: v for b in (b for bs in pages.values() for b in bs) for k, v in serve_env(b).items()}
    database_url = f"sqlite:///{tmp_path / 'docs.db'}"
    server = Server(
        database_url,
        tmp_path / "serve.log",
        env={
            **env,
            "PYTHONPATH": os.pathsep.join(map(str, [*folders, ROOT])),
            # The pages' framework agents make their model client at import; nothing is sent.
            "OPENAI_API_KEY": "sk-docs",
            "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        },
        app="docs_app:app",
    ).start(timeout=180)  # the pages' apps import Pydantic AI: slow on a loaded machine
    try:
        key = make_key(database_url, "default", ALL_SCOPES)
        bin_dir = curl_that_fails_on_http_errors(tmp_path)
        shell_env = {k: v for k, v in os.environ.items() if not k.startswith("LANTERN_")}
        shell_env |= {
            "PATH": os.pathsep.join([str(bin_dir), str(Path(LANTERN).parent), os.environ["PATH"]]),
            "LANTERN_DATABASE_URL": database_url,
            "LANTERN_URL": server.url,
            "LANTERN_API_KEY": key,
            "LANTERN_EGRESS_ALLOW": os.environ["LANTERN_EGRESS_ALLOW"],
            "PYTHONPATH": str(ROOT),
        }
        failures = []
        for page in run_order(pages):
            page_blocks = pages[page]
            clone = tmp_path / Path(page).stem  # the reader's clone: its examples and venv
            clone.mkdir()
            (clone / "examples").symlink_to(ROOT / "examples")
            (clone / ".venv").symlink_to(Path(LANTERN).parent.parent)
            text, lines = script(page_blocks, server.port)
            done = subprocess.run(
                ["bash", "-c", text],
                cwd=clone,
                env=shell_env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if done.returncode != 0:
                at = re.findall(r"failed at script line (\d+)", done.stderr)
                line = lines[int(at[-1]) - 1] if at else "?"
                failures.append(f"{page}:{line}: exit {done.returncode}\n{done.stderr[-1500:]}")
    finally:
        # Killed, not stopped: rate-limits.md's last runs wait out their minute, and a clean
        # stop would give them its 30 s of grace first. Nothing here checks the stop.
        server.kill()
    assert failures == [], "\n\n".join(failures)


@pytest.mark.parametrize(
    ("line", "runs"),
    [
        ("curl -s $LANTERN_URL/v1/receipts/keys", True),
        ("export X=$(lantern runs list)", True),
        (".venv/bin/lantern agents apply story.json", True),
        ("lantern keys create --scopes runs:read", False),
        ("lantern runtime check", False),
        (".venv/bin/pip install -e '.[pydantic-ai]'", False),
    ],
)
def test_which_commands_talk_to_a_server(line: str, runs: bool) -> None:
    assert runnable(Block("docs/x.md", 1, "sh", [line])) is runs
    assert not runnable(Block("docs/x.md", 1, "", [line]))


def test_a_page_that_sets_a_rate_limit_runs_after_the_others() -> None:
    curl = Block("docs/a.md", 1, "sh", ["curl -sX PUT $LANTERN_URL/v1/limits/x -d @l.json"])
    cli = Block("docs/b.md", 1, "sh", ["lantern limits set offline-rpm limit.json"])
    runs = Block("docs/c.md", 1, "sh", ["lantern run story", "lantern limits list"])
    pages = {"docs/a.md": [curl], "docs/b.md": [cli], "docs/c.md": [runs], "docs/d.md": [runs]}
    assert run_order(pages) == ["docs/c.md", "docs/d.md", "docs/a.md", "docs/b.md"]
