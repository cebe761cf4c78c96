"""Code-first agents from the real ``lantern`` command: run, show, resume, and their errors."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path

import lantern
from lantern.engine.runs import create_run
from lantern.engine.worker import Worker
from lantern.store import open_store
from tests.integration.test_cli import Cli

JOBS = textwrap.dedent(
    """
    import lantern

    app = lantern.App()


    def square(x: int) -> int:
        return x * x


    @app.agent("squares")
    def squares(ctx: lantern.Context, n: int) -> list[int]:
        return [ctx.step("square", square, k) for k in range(n)]
    """
)


def versioned(version: str) -> lantern.App:
    app = lantern.App()

    @app.agent("tally", version=version)
    async def tally(ctx: lantern.Context) -> str:
        return str(await ctx.step("which", lambda: version))

    return app


async def park_for_v1(url: str) -> str:
    """A run of tally v1 that a replica with v2 left waiting."""
    store = open_store(url)
    await store.open()
    try:
        run = await create_run(store, "tally", None, app=versioned("v1"))
        async with Worker(store, versioned("v2"), worker_id="new", lease_ttl=60) as w:
            assert w.runner is not None
            await w.runner.drive(run.id)
        return run.id
    finally:
        await store.close()


async def drive_with_v2(url: str, run_id: str) -> lantern.store.Run | None:
    store = open_store(url)
    await store.open()
    try:
        async with Worker(store, versioned("v2"), worker_id="new", lease_ttl=60) as w:
            assert w.runner is not None
            await w.runner.drive(run_id)
        return await store.get_run(run_id)
    finally:
        await store.close()


def test_a_code_agent_runs_from_the_command_line(database_url: str, tmp_path: Path) -> None:
    cli = Cli(database_url, tmp_path)
    cli.write("jobs.py", JOBS)
    args = ["run", "squares", "--wait", "--app", "jobs:app", "--input"]
    done = json.loads(cli(*args, json.dumps({"n": 3})).stdout)
    assert done["status"] == "succeeded" and done["output"] == [0, 1, 4]
    shown = cli("runs", "show", done["id"]).stdout
    assert "square#3" in shown and "completed" in shown
    listed = cli("agents", "list").stdout
    assert "squares" in listed and "code" in listed and "jobs" in listed
    assert cli.fails(*args, "{}", status=2) == "agent 'squares': the input needs 'n'"


def test_a_run_left_for_its_version_is_shown_and_resumed(database_url: str, tmp_path: Path) -> None:
    cli = Cli(database_url, tmp_path)
    run_id = asyncio.run(park_for_v1(database_url))
    shown = cli("runs", "show", run_id).stdout
    assert "waits for version v1" in shown and "replica new has v2" in shown
    assert f"lantern runs resume {run_id} --version" in " ".join(shown.split())
    moved = cli("runs", "resume", run_id, "--version", "v2").stdout
    assert moved.strip() == f"{run_id} waiting: pinned to version v2"
    done = asyncio.run(drive_with_v2(database_url, run_id))
    assert done is not None and done.status == "succeeded" and done.output == "v2"
    finished = cli.fails("runs", "resume", run_id, "--version", "v3", status=1)
    assert finished == f"run {run_id} has already finished (succeeded)"
    assert cli.fails("runs", "resume", "run_nope", "--version", "v3", status=1) == (
        "run run_nope not found"
    )
