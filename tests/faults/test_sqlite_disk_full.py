"""SQLite on a filesystem that fills up (a small tmpfs this test mounts; it needs root):
the run waits, the failing commit names the real cause ("database or disk is full"),
readiness fails, and once space is freed the run goes on and the writer keeps working."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import lantern
from lantern.engine.readiness import not_ready
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.store import Store, open_store
from tests.integration.test_run_control import until
from tests.integration.test_runner import graph, tool

BIG = 1 << 20  # a 1 MiB output: more than the file system has left once it is full


@pytest.fixture
def small_fs() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    where = Path(tempfile.mkdtemp(prefix="lantern-full-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        with contextlib.suppress(OSError):
            where.rmdir()


def fill(path: Path) -> None:
    """Write zeros until the file system is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
        with contextlib.suppress(OSError):  # the last few bytes
            while True:
                os.write(fd, b"\0" * 512)
    finally:
        os.close(fd)


gate = asyncio.Event()


def disk_app() -> lantern.App:
    a = lantern.App()

    @a.tool("echo")
    async def echo(**kwargs: Any) -> dict[str, Any]:
        return kwargs

    @a.tool("big")
    async def big() -> dict[str, Any]:
        await gate.wait()
        return {"text": os.urandom(BIG // 2).hex()}

    return a


@pytest.fixture
async def full_store(small_fs: Path) -> AsyncIterator[Store]:
    store = open_store(f"sqlite:///{small_fs / 'lantern.db'}")
    await store.open()
    yield store
    await store.close()


async def test_a_full_disk_makes_the_run_wait_and_it_goes_on_once_space_is_freed(
    full_store: Store, small_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = full_store
    caplog.set_level(logging.WARNING)
    gate.clear()
    await apply_agent(
        store, graph("big", [tool("b", "big"), tool("after")], [("start", "b"), ("b", "after")])
    )
    await apply_agent(store, graph("small", [tool("a")], [("start", "a")]))
    async with Worker(store, disk_app(), worker_id="w1", lease_ttl=30, poll_interval=0.05) as w:
        serving = asyncio.create_task(w.serve())
        try:
            run = await create_run(store, "big", {})
            await until(store, run.id, "running")
            await asyncio.sleep(0.3)  # the step is in flight
            filler = small_fs / "filler"
            await asyncio.to_thread(fill, filler)
            gate.set()  # the step ends; its commit meets the full disk
            assert w.runner is not None
            health = w.runner.write_health
            for _ in range(400):  # the failing commit is seen within 20 s
                if health.failing_since is not None:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(1)
            held = await store.get_run(run.id)
            assert held is not None and held.status == "running"  # waiting, not lost
            assert "full" in (health.cause or "")
            why = await not_ready(store, "w1", w.started_at, health)
            assert why is not None and "full" in why
            assert "database or disk is full" in caplog.text
            assert "cannot start a transaction within a transaction" not in caplog.text

            filler.unlink()  # space is freed
            done = await until(store, run.id, "succeeded", "failed", timeout=20)
            assert done.status == "succeeded", done.error
            assert await not_ready(store, "w1", w.started_at, health) is None
            # The writer kept working: a new run goes through as well.
            after = await create_run(store, "small", {})
            assert (await until(store, after.id, "succeeded", "failed")).status == "succeeded"
            events = await store.events(run.id)
            completed = [e.step_id for e in events if e.kind == "step_completed"]
            assert None not in completed  # a step event names its step
            assert sorted(s for s in completed if s is not None) == ["after", "b", "start"]
            assert "run_recovered" not in {e.kind for e in events}
        finally:
            await w.stop(grace=1)
            await serving
