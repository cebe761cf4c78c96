"""The first model call of a process imports its provider's SDK (openai takes one to several
seconds) off the event loop, so the other runs on the loop do not wait it out. Measured in a
fresh interpreter, where the SDK is not imported yet."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import asyncio, sys, time
from lantern.models.registry import Models

async def main():
    gaps, done = [], False
    async def tick():
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)
    assert "openai" not in sys.modules
    started = time.perf_counter()
    await Models().provider_for("gpt-4o-mini")
    took = time.perf_counter() - started
    done = True
    await ticker
    print(took, max(gaps))

asyncio.run(main())
"""


def test_the_first_model_call_imports_its_sdk_off_the_loop() -> None:
    env = {**os.environ, "OPENAI_API_KEY": "sk-test"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr
    took, longest_gap = (float(x) for x in done.stdout.split())
    # Imported on the loop, the ticker would stop for the whole import.
    assert longest_gap < took / 3, f"the loop stalled {longest_gap:.3f} s of a {took:.3f} s import"
