"""Real `lantern serve` processes for the crash tests: start, SIGKILL, restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.server import free_port

ROOT = Path(__file__).resolve().parents[2]
LANTERN = str(Path(sys.executable).parent / "lantern")


class Serve:
    """One `lantern serve --app tests.crash.crash_app:app` process, its output in a file."""

    def __init__(
        self, database_url: str, log: Path, app: str = "tests.crash.crash_app:app", **env: str
    ) -> None:
        self.log = log
        self.port = free_port()
        full_env = {
            **os.environ,
            "LANTERN_DATABASE_URL": database_url,
            "PYTHONPATH": str(ROOT),
            "LANTERN_PORT": str(self.port),
            "LANTERN_DATA_DIR": str(log.parent),  # its receipt signing key
            **env,
        }
        self.port = int(full_env["LANTERN_PORT"])  # a test may give its own
        self.out = log.open("ab")
        self.proc = subprocess.Popen(
            [LANTERN, "serve", "--app", app],
            env=full_env,
            cwd=ROOT,
            stdout=self.out,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 60) -> None:
        """Block until it answers /healthz: its worker is then up and sweeping."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lantern serve exited: {self.output()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"lantern serve did not answer /healthz within {timeout} s")

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
