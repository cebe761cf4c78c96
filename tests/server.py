"""A real `lantern serve` process on 127.0.0.1 for API tests, with keys per workspace."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from lantern.server.auth import issue_key
from lantern.store import open_store

ROOT = Path(__file__).resolve().parent.parent
LANTERN = str(Path(sys.executable).parent / "lantern")
ALL_SCOPES = "runs:execute,runs:read,runs:approve,agents:write,agents:read"


class PortTaken(Exception):
    """The server could not bind its port."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_key(
    database_url: str,
    workspace: str,
    scopes: str,
    name: str | None = None,
    *,
    operator: bool = False,
) -> str:
    async def issue() -> str:
        store = open_store(database_url)
        await store.open()
        try:
            wanted = {s for s in scopes.split(",") if s}
            _, plaintext = await issue_key(store, workspace, wanted, name, operator=operator)
        finally:
            await store.close()
        return plaintext

    return asyncio.run(issue())


@dataclass
class Server:
    database_url: str
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    app: str = "tests.crash.crash_app:app"
    started: bool = False  # answered once: a restart keeps its port (and worker id)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> Server:
        for _ in range(3):
            try:
                return self._start(timeout)
            except PortTaken:
                # Between free_port() and the server's bind, another process (an outgoing
                # connection's ephemeral port, as often as not) took it: a first start may move.
                if self.started:
                    raise
                self.port = free_port()
        return self._start(timeout)

    def _start(self, timeout: float) -> Server:
        logged = self.log.stat().st_size if self.log.exists() else 0
        env = {
            **os.environ,
            "LANTERN_DATABASE_URL": self.database_url,
            "LANTERN_PORT": str(self.port),
            "LANTERN_WORKER_ID": f"test-{self.port}",
            "PYTHONPATH": str(ROOT),
            "LANTERN_DATA_DIR": str(self.log.parent),  # its receipt signing key
            # Test peers are on loopback (docs/security.md); a test of the policy overrides this.
            "LANTERN_EGRESS_ALLOW": os.environ.get("LANTERN_EGRESS_ALLOW") or "127.0.0.1,::1",
            "LANTERN_RATE_LIMIT": os.environ.get("LANTERN_RATE_LIMIT", "0"),
            **self.env,
        }
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [LANTERN, "serve", "--app", self.app],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                text = self.log.read_bytes()
                if b"address already in use" in text[logged:]:
                    raise PortTaken(self.port)
                raise RuntimeError(f"lantern serve exited: {text[-2000:].decode(errors='replace')}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    self.started = True
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.kill()  # a server the caller never got back would outlive the test
        raise RuntimeError(f"lantern serve did not answer /healthz within {timeout} s")

    def workspace_key(self, scopes: str = ALL_SCOPES) -> tuple[str, str]:
        """A workspace no other test of a shared server uses, and a key to it."""
        workspace = f"w{secrets.token_hex(5)}"
        return workspace, make_key(self.database_url, workspace, scopes)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(30)
