"""A small HTTP receiver on 127.0.0.1 that records every request it gets.

The demo and the tests point http connectors at it to count deliveries and their
Idempotency-Keys (a request whose body never arrived, its sender killed mid-request, is none).
``hold(path)`` keeps requests to a path waiting (a request in flight) until ``release()``, so a
test can kill the sender at exactly that moment; ``fail(path, status, n)`` answers the next
``n`` requests to a path with an error status, as a flaky service would.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Hit:
    path: str
    method: str
    idempotency_key: str | None
    body: Any
    headers: dict[str, str] = field(default_factory=dict)  # names in lower case


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # many runs deliver at once; the default backlog of 5 drops them
    daemon_threads = True


class Receiver:
    def __init__(self) -> None:
        self.hits: list[Hit] = []
        self._lock = threading.Lock()
        self._held: str | None = None
        self._release = threading.Event()
        self._failures: dict[str, tuple[int, int]] = {}  # path -> (status, how many more)
        self.arrived = threading.Event()  # a held request has arrived
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: senders reuse their connections
            disable_nagle_algorithm = True  # headers and body go out at once, no 40 ms stall

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if len(raw) < length:
                    # The sender died between its headers and its body (a crash test's
                    # SIGKILL): nothing was delivered, so nothing is counted or answered.
                    self.close_connection = True
                    return
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                hit = Hit(
                    self.path,
                    self.command,
                    self.headers.get("Idempotency-Key"),
                    body,
                    {k.lower(): v for k, v in self.headers.items()},
                )
                with receiver._lock:
                    receiver.hits.append(hit)
                    count = sum(1 for h in receiver.hits if h.path == self.path)
                    held = receiver._held == self.path
                    status = receiver._next_status(self.path)
                if held:
                    receiver.arrived.set()
                    receiver._release.wait(60)
                payload = json.dumps({"path": self.path, "received": count}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                try:
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the sender died mid-request: the point of the crash tests

            do_PUT = do_POST
            do_GET = do_POST

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Receiver:
        self._thread.start()
        return self

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()

    def hold(self, path: str) -> None:
        """Keep the next requests to ``path`` in flight until ``release()``."""
        with self._lock:
            self._held = path
            self._release.clear()
            self.arrived.clear()

    def release(self) -> None:
        with self._lock:
            self._held = None
        self._release.set()

    def fail(self, path: str, status: int, times: int) -> None:
        """Answer the next ``times`` requests to ``path`` with ``status``."""
        with self._lock:
            self._failures[path] = (status, times)

    def _next_status(self, path: str) -> int:
        status, left = self._failures.get(path, (200, 0))
        if left <= 0:
            return 200
        self._failures[path] = (status, left - 1)
        return status

    def count(self, path: str) -> int:
        with self._lock:
            return sum(1 for h in self.hits if h.path == path)

    def keys(self, path: str) -> set[str | None]:
        with self._lock:
            return {h.idempotency_key for h in self.hits if h.path == path}

    def applied(self, path: str) -> int:
        """How many requests to ``path`` a receiver that de-duplicates by Idempotency-Key
        applies: the first of each key (and every request that carries none)."""
        with self._lock:
            hits = [h for h in self.hits if h.path == path]
        keyed = {h.idempotency_key for h in hits if h.idempotency_key is not None}
        return len(keyed) + sum(1 for h in hits if h.idempotency_key is None)


@contextmanager
def running() -> Iterator[Receiver]:
    receiver = Receiver().start()
    try:
        yield receiver
    finally:
        receiver.close()
