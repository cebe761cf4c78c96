"""A forward HTTP proxy on 127.0.0.1, as a corporate network puts between a client and a server:
``CONNECT`` tunnels (for https://) and requests in absolute form (for http://), relayed to the
server. It records what each request asked of it, and answers 407 without the credentials it
was started with."""

from __future__ import annotations

import base64
import http.client
import select
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {"proxy-authorization", "proxy-connection", "connection", "keep-alive"}


@dataclass
class Proxy:
    url: str
    seen: list[tuple[str, str]] = field(default_factory=list)  # (method, target)


@contextmanager
def forward_proxy(user: str | None = None, password: str = "") -> Iterator[Proxy]:
    expected = None if user is None else base64.b64encode(f"{user}:{password}".encode()).decode()
    found = Proxy("")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def allowed(self) -> bool:
            found.seen.append((self.command, self.path))
            if expected is None or self.headers.get("Proxy-Authorization") == f"Basic {expected}":
                return True
            self.send_response(407)
            self.send_header("Proxy-Authenticate", 'Basic realm="test"')
            self.send_header("Content-Length", "0")
            self.send_header("Connection", "close")
            self.end_headers()
            return False

        def do_CONNECT(self) -> None:
            if not self.allowed():
                return
            host, _, port = self.path.rpartition(":")
            upstream = socket.create_connection((host, int(port)), timeout=10)
            self.send_response(200, "Connection established")
            self.end_headers()
            self.close_connection = True
            pair = [self.connection, upstream]
            try:
                while True:
                    ready, _, _ = select.select(pair, [], [], 10)
                    if not ready:
                        return
                    for sock in ready:
                        data = sock.recv(65536)
                        if not data:
                            return
                        (upstream if sock is self.connection else self.connection).sendall(data)
            finally:
                upstream.close()

        def relay(self) -> None:
            if not self.allowed():
                return
            target = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            upstream = http.client.HTTPConnection(target.hostname or "", target.port, timeout=10)
            try:
                path = target.path + (f"?{target.query}" if target.query else "")
                upstream.request(self.command, path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
            finally:
                upstream.close()
            self.send_response(answer.status)
            for name, value in answer.getheaders():
                if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = relay

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    found.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()
