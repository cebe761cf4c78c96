"""`lantern demo microvm`: the story a user runs, end to end."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.runtime.conftest import working
from tests.server import LANTERN, ROOT

pytestmark = pytest.mark.timeout(300)


def test_the_microvm_demo_resumes_on_the_other_node(tmp_path: Path) -> None:
    working("sandbox")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANTERN_")}
    done = subprocess.run(
        [LANTERN, "demo", "microvm", "--workdir", str(tmp_path)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SIGKILL" in done.stdout and "succeeded" in done.stdout
    assert "node_lost" in done.stdout
    assert "LANTERN_RESUME=1, 1 step(s) served from the journal" in done.stdout
