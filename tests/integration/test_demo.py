"""`lantern demo` tells its story end to end and checks its own receiver counts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LANTERN = str(Path(sys.executable).parent / "lantern")


def test_demo_crashes_resumes_and_delivers_each_once(tmp_path: Path) -> None:
    done = subprocess.run(
        [LANTERN, "demo", "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "SIGKILL while ship was in flight" in out
    assert "status succeeded" in out
    assert out.count("replayed") >= 3 and "re-run, same key" in out
    # The words match the table: the cut-off request arrived twice, under one key, applied once.
    assert "/shipments: the receiver saw 2 requests with one Idempotency-Key and applied one" in out
    assert "four-step" not in out and "made once" not in out
    assert "draft: model offline/echo (offline)" in out  # the model step, no key needed
    assert "Receipt verified" in out
    # It ends by pointing at the browser view of this run and at the tutorial, which exists.
    assert "/ui/runs/run_" in out and "docs/tutorial.md" in out
    assert (Path(__file__).parents[2] / "docs" / "tutorial.md").is_file()
