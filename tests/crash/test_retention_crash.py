"""A retention pass SIGKILLed mid-way leaves every run whole or gone (both backends): each
run's deletion is one transaction. Deletion is the same for every kind of run (graph, plain,
code-first, microVM): it removes rows, whoever wrote them."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lantern.store import Store
from tests.conformance.test_retention_store import BIG, run_with

ROOT = Path(__file__).resolve().parents[2]
RUNS = 120

# Deletes one run per transaction, slowly enough to be killed between and inside them.
PASS = """
import asyncio, sys
from lantern.engine.retention import retention_pass
from lantern.store import open_store

async def main():
    store = open_store(sys.argv[1])
    await store.open()
    print("deleting", flush=True)
    while (await retention_pass(store, 0.001, per_transaction=1)).runs:
        pass

asyncio.run(main())
"""


async def test_a_killed_pass_leaves_no_half_deleted_run(store: Store) -> None:
    runs = [await run_with(store, BIG if n % 2 else {"n": n}) for n in range(RUNS)]
    whole = {run_id: len(await store.events(run_id)) for run_id, _ in runs}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PASS, store.url, env=env, stdout=subprocess.PIPE, cwd=ROOT
    )
    try:
        assert proc.stdout is not None and (await proc.stdout.readline()).strip() == b"deleting"
        deadline = time.monotonic() + 60
        ids = [run_id for run_id, _ in runs]
        while len(await store.runs_in_workspace("default", ids)) > RUNS * 3 // 4:
            assert time.monotonic() < deadline and proc.returncode is None
            await asyncio.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    gone = 0
    for run_id, ref in runs:
        events = await store.events(run_id, blobs=True)
        if await store.get_run(run_id) is None:
            gone += 1
            assert events == [] and await store.deliveries(run_id) == []
        else:
            assert len(events) == whole[run_id], f"run {run_id} is half-deleted"
            if ref.startswith("sha256:"):
                assert await store.blob(run_id, ref) is not None
    assert RUNS // 4 <= gone < RUNS
