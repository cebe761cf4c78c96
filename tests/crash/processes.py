"""Real `lantern serve` processes for the crash tests: start, SIGKILL, restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.server import free_port

ROOT = Path(__file__).resolve().parents[2]
LANTERN = str(Path(sys.executable).parent / "lantern")


class Serve:
    """One `lantern serve --app tests.crash.crash_app:app` process, its output in a file."""

    def __init__(
        self, database_url: str, log: Path, app: str = "tests.crash.crash_app:app", **env: str
    ) -> None:
        self.log = log
        full_env = {
            **os.environ,
            "LANTERN_DATABASE_URL": database_url,
            "PYTHONPATH": str(ROOT),
            "LANTERN_PORT": str(free_port()),
            "LANTERN_DATA_DIR": str(log.parent),  # its receipt signing key
            **env,
        }
        self.out = log.open("ab")
        self.proc = subprocess.Popen(
            [LANTERN, "serve", "--app", app],
            env=full_env,
            cwd=ROOT,
            stdout=self.out,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.out.close()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        self.out.close()
        return code

    def output(self) -> str:
        return self.log.read_text(errors="replace")
