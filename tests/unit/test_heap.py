"""The server's heap settings: what ``lantern serve`` applies before it serves."""

from __future__ import annotations

import subprocess
import sys

SETTLED = """
import gc, time
from lantern.server import heap
from lantern.server.app import create_app   # what lantern serve has loaded by then
before = len(gc.get_objects())
heap.settle()
after = len(gc.get_objects())
print(before, after, gc.get_freeze_count(), gc.get_threshold()[0])
"""


def test_settle_takes_what_loading_left_out_of_every_later_collection() -> None:
    # In a process of its own: freezing is for the server's process, never a test worker's.
    done = subprocess.run(
        [sys.executable, "-c", SETTLED], capture_output=True, text=True, check=True, timeout=60
    )
    before, after, frozen, young = (int(n) for n in done.stdout.split())
    # A collection walks only the objects it tracks: after settling, nearly none are left.
    assert before > 50_000 and frozen >= before * 0.9, done.stdout
    assert after < 1_000, done.stdout
    assert young == 10_000
