"""What the hostile tests share: a tenant's client on a real server, a background probe of
/healthz, and peers on 127.0.0.1 that count what reached them.

Each attack is tried while a probe asks the server's /healthz every 100 ms; the test fails if
any answer took longer than PROBE_LIMIT. With ``LANTERN_HOSTILE_REPORT=FILE`` every test appends
one JSON line (its class, how many hostile inputs it tried, the worst /healthz wait) so the
suite's figures can be summed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from tests.server import Server, make_key

PROBE_LIMIT = 1.0
TERMINAL = {"succeeded", "failed", "cancelled"}


class Probe:
    """GET /healthz every 100 ms on its own thread; ``worst`` is the longest wait seen."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.worst = 0.0
        self.answers = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    status = client.get(f"{self.url}/healthz").status_code
                    if status != 200:
                        self.failures.append(f"/healthz answered {status}")
                except httpx.HTTPError as exc:
                    self.failures.append(f"/healthz failed: {exc!r}")
                took = time.monotonic() - started
                self.worst = max(self.worst, took)
                self.answers += 1
                self._stop.wait(max(0.0, 0.1 - took))

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        deadline = time.monotonic() + PROBE_LIMIT * 2
        while self.answers == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # an attack shorter than one probe still gets one
        self._stop.set()
        self._thread.join(10)


@contextmanager
def attack(server: Server, kind: str, inputs: int) -> Iterator[Probe]:
    """Run the block as an attack of ``kind`` made of ``inputs`` hostile inputs; the server
    must answer /healthz within PROBE_LIMIT throughout."""
    with Probe(server.url) as probe:
        yield probe
    report = os.environ.get("LANTERN_HOSTILE_REPORT")
    if report:
        line = {"class": kind, "inputs": inputs, "worst": probe.worst, "test": _current()}
        with open(report, "a") as out:
            out.write(json.dumps(line) + "\n")
    assert probe.answers > 0
    assert not probe.failures, probe.failures[:3]
    assert probe.worst < PROBE_LIMIT, f"/healthz waited {probe.worst:.3f} s during the attack"


def _current() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]


class Tenant:
    """One workspace's API key on a server."""

    def __init__(self, server: Server, workspace: str, scopes: str) -> None:
        self.server = server
        self.workspace = workspace
        key = make_key(server.database_url, workspace, scopes)
        self.http = httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        )

    def close(self) -> None:
        self.http.close()

    def apply(self, definition: dict[str, Any]) -> httpx.Response:
        return self.http.put(f"/v1/agents/{definition['name']}", json=definition)

    def start(self, agent: str, input: Any = None) -> str:
        response = self.http.post("/v1/runs", json={"agentName": agent, "input": input or {}})
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    def finished(self, run_id: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run: dict[str, Any] = self.http.get(f"/v1/runs/{run_id}").json()
            if run["status"] in TERMINAL:
                return run
            time.sleep(0.05)
        raise AssertionError(f"run {run_id} did not finish within {timeout} s")

    def events(self, run_id: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        after = 0
        while True:
            page = self.http.get(f"/v1/runs/{run_id}/events", params={"after": after}).json()
            items.extend(page["items"])
            if not page.get("nextAfter"):
                return items
            after = page["nextAfter"]


def connector_agent(name: str, url: str, **data: Any) -> dict[str, Any]:
    return {
        "name": name,
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {
                    "id": "fetch",
                    "type": "connector",
                    "data": {"connector": "http", "method": "GET", "url": url, **data},
                },
            ],
            "edges": [{"source": "start", "target": "fetch"}],
        },
    }


Answer = tuple[int, dict[str, str], bytes]


@dataclass
class Peer:
    """A real HTTP server on 127.0.0.1 answering from ``routes`` (path -> (status, headers,
    body)); it counts every request, so a test can assert that nothing reached it. With
    ``echo``, a path no route names is answered with the request itself as JSON (its path,
    headers and body), with status 500 when the path starts with /fail."""

    routes: dict[str, Answer] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)
    echo: bool = False
    received: list[bytes] = field(default_factory=list)
    # Requests to /hold... wait until ``release`` is set; /big/N answers N MB in chunks,
    # /slow answers a byte every 0.2 s, /deep/N a JSON array nested N deep.
    release: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        peer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                peer.hits.append(self.path)
                peer.received.append(str(self.headers).encode() + self.path.encode() + raw)
                if self.path.startswith("/hold"):
                    peer.release.wait(60)
                if self.path.startswith(("/big/", "/slow")):
                    self._stream()
                    return
                if self.path.startswith("/deep/"):
                    n = int(self.path.rsplit("/", 1)[1])
                    peer.routes[self.path] = (200, {}, b"[" * n + b"]" * n)
                status, headers, body = peer.routes.get(self.path) or self._default(raw)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _stream(self) -> None:
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    if self.path.startswith("/big/"):
                        chunk = b"x" * 65536
                        for _ in range(int(self.path.rsplit("/", 1)[1]) * 16):
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    else:
                        for _ in range(300):
                            self.wfile.write(b"1\r\nx\r\n")
                            self.wfile.flush()
                            time.sleep(0.2)
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass
                self.close_connection = True

            def _default(self, raw: bytes) -> Answer:
                if not peer.echo:
                    return 200, {}, b'{"ok": true}'
                echoed = {
                    "path": self.path,
                    "headers": dict(self.headers.items()),
                    "body": raw.decode(errors="replace"),
                }
                status = 500 if self.path.startswith("/fail") else 200
                return status, {"Content-Type": "application/json"}, json.dumps(echoed).encode()

            do_GET = do_POST = do_PUT = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class _Server(ThreadingHTTPServer):
            daemon_threads = True

        self._server = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
