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
    assert "Each delivery made once" in out
    assert "draft: model offline/echo (offline)" in out  # the model step, no key needed
    assert "Receipt verified" in out
