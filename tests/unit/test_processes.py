"""The supervisor of `lantern serve --workers`: a worker that keeps dying is started again ever
more slowly, and a stop does not wait out the pause. (Workers killed mid-run, the parent's stop
and its death: tests/crash/test_serve_workers.py.)"""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import time
from pathlib import Path

CRASHING = """
import sys, time
from lantern.cli import processes
starts = open(sys.argv[1], "a")
def worker(index):
    starts.write(f"{time.monotonic()}\\n")
    starts.flush()
    return 1  # dies at once, as a worker that crashes right after its start
sys.exit(processes.supervise(1, worker))
"""


def test_a_worker_that_keeps_dying_is_started_again_ever_more_slowly(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    # In a process of its own: the supervisor forks and takes SIGTERM.
    parent = subprocess.Popen(
        [sys.executable, "-c", CRASHING, str(starts)], stderr=subprocess.PIPE, text=True
    )
    time.sleep(4.5)  # started at 0 s, 1 s and 3 s (pauses of 1 s, then 2 s); next at 7 s
    asked = time.monotonic()
    parent.send_signal(signal.SIGTERM)
    _, log = parent.communicate(timeout=10)
    assert parent.returncode == 0, log
    assert time.monotonic() - asked < 1.5, log  # the 4 s pause under way is not waited out
    times = [float(t) for t in starts.read_text().split()]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert len(times) == 3, gaps
    assert 0.95 < gaps[0] < 1.9 and 1.95 < gaps[1] < 3.4, gaps
    assert "starting it again in 1 s" in log and "starting it again in 2 s" in log
