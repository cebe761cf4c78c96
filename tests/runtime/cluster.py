"""Real processes for the microVM tier's tests: `lantern serve` replicas and `lantern node`s."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.runtime.vms import APPS
from tests.server import LANTERN, ROOT, Server, make_key

FAST = {
    "LANTERN_NODE_TTL": "2s",
    "LANTERN_LEASE_TTL": "6s",
    "LANTERN_RECOVERY_INTERVAL": "1s",
}


@dataclass
class RuntimeNodeProcess:
    node_id: str
    database_url: str
    control_url: str
    log: Path
    driver: str = "sandbox"
    capacity: int = 4
    app_dir: Path = APPS
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    warm: int | None = None  # --warm: None leaves the driver's default
    args: tuple[str, ...] = ()  # more of lantern node's options
    cwd: Path = ROOT  # where it is started (a user's project folder, say)

    def start(self) -> RuntimeNodeProcess:
        env = {
            **os.environ,
            **FAST,
            "LANTERN_DATABASE_URL": self.database_url,
            "LANTERN_URL": self.control_url,
            "PYTHONPATH": str(ROOT),
            **self.env,
        }
        env.pop("LANTERN_API_KEY", None)
        argv = [
            LANTERN, "node", "--driver", self.driver, "--capacity", str(self.capacity),
            "--app", str(self.app_dir), "--node-id", self.node_id, "--labels", "test=1",
            *([] if self.warm is None else ["--warm", str(self.warm)]), *self.args,
        ]  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, env=env, cwd=self.cwd, stdout=out, stderr=out)
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)
        if sig == signal.SIGKILL:
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class Cluster:
    """Replicas of the control plane and runtime nodes on one database."""

    def __init__(self, database_url: str, tmp: Path) -> None:
        self.database_url = database_url
        self.tmp = tmp
        self.servers: list[Server] = []
        self.nodes: list[RuntimeNodeProcess] = []
        self.key = make_key(database_url, "default", "runs:execute,runs:read,agents:write,admin")
        # The scheduler and the runtime nodes serve every workspace: a workspace's admin key
        # cannot read them (docs/runtime.md).
        self.operator = make_key(database_url, "default", "", operator=True)

    def serve(self, n: int = 1, *, app: str | None = None, **env: str) -> Cluster:
        for i in range(n):
            log = self.tmp / f"serve-{len(self.servers)}-{i}.log"
            server = Server(self.database_url, log, env={**FAST, **env})
            if app is not None:
                server.app = app
            self.servers.append(server.start())
        return self

    def node(self, node_id: str, server: int = 0, **kw: Any) -> RuntimeNodeProcess:
        log = self.tmp / f"{node_id}.log"
        control = self.servers[server].url
        found = RuntimeNodeProcess(node_id, self.database_url, control, log, **kw)
        self.nodes.append(found.start())
        return found

    def close(self) -> None:
        for node in self.nodes:
            node.stop()
        for server in self.servers:
            if server.proc is not None and server.proc.poll() is None:
                server.stop()

    # -- the API -------------------------------------------------------------------------

    def api(
        self, method: str, path: str, server: int = 0, key: str | None = None, **kw: Any
    ) -> httpx.Response:
        url = self.servers[server].url + path
        headers = {"Authorization": f"Bearer {key or self.key}"}
        return httpx.request(method, url, headers=headers, timeout=30, **kw)

    def ok(self, method: str, path: str, **kw: Any) -> Any:
        response = self.api(method, path, **kw)
        assert response.status_code < 300, response.text
        return response.json()

    def agent(self, name: str, entrypoint: str, **runtime: Any) -> None:
        block = {"tier": "microvm", "entrypoint": entrypoint, "driver": "sandbox", **runtime}
        self.ok("PUT", f"/v1/agents/{name}", json={"name": name, "runtime": block})

    def start_run(self, agent: str, input: Any) -> str:
        found: str = self.ok("POST", "/v1/runs", json={"agentName": agent, "input": input})["id"]
        return found

    def events(self, run_id: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        after = 0
        while True:
            page = self.ok("GET", f"/v1/runs/{run_id}/events", params={"after": after})
            items += page["items"]
            if not page.get("nextAfter"):
                return items
            after = page["nextAfter"]

    def vms(self, run_id: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.ok("GET", f"/v1/runs/{run_id}/vms")["items"]
        return found

    def wait_for(self, what: Callable[[], Any], timeout: float = 60, every: float = 0.1) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = what()
            if found:
                return found
            time.sleep(every)
        raise AssertionError(f"timed out waiting for {what.__doc__ or what}")

    def finished(self, run_id: str, timeout: float = 90) -> dict[str, Any]:
        def done() -> Any:
            run = self.ok("GET", f"/v1/runs/{run_id}")
            return run if run["status"] in ("succeeded", "failed", "cancelled") else None

        found: dict[str, Any] = self.wait_for(done, timeout, 0.2)
        return found
