"""Request rate per key, and clients that hold connections open (slowloris), against a real
`lantern serve`: the server keeps answering everyone else within a second."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.hostile.kit import Tenant, attack
from tests.server import Server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp("rates")
    env = {"LANTERN_RATE_LIMIT": "5", "LANTERN_BODY_TIMEOUT": "1s"}
    s = Server(f"sqlite:///{tmp / 'lantern.db'}", tmp / "serve.log", env=env).start()
    yield s
    s.stop()


def test_a_key_over_its_rate_gets_429_and_others_do_not(server: Server) -> None:
    greedy = Tenant(server, "greedy", "runs:read")
    calm = Tenant(server, "calm", "runs:read")
    try:
        with attack(server, "rate", 40):
            answers = [greedy.http.get("/v1/runs") for _ in range(40)]
            limited = [a for a in answers if a.status_code == 429]
            assert len(limited) >= 20, [a.status_code for a in answers]
            assert all(a.status_code in (200, 429) for a in answers)
            assert int(limited[0].headers["Retry-After"]) >= 1
            assert "LANTERN_RATE_LIMIT" in limited[0].json()["detail"]
            assert calm.http.get("/v1/runs").status_code == 200  # a bucket of its own
        time.sleep(1.2)
        assert greedy.http.get("/v1/runs").status_code == 200  # refilled
    finally:
        greedy.close()
        calm.close()


def test_slow_clients_hold_nothing_long(server: Server) -> None:
    tenant = Tenant(server, "slow", "agents:write")
    sockets: list[socket.socket] = []
    try:
        with attack(server, "slowloris", 101):
            for _ in range(100):  # headers that never end
                s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
                s.sendall(b"GET /v1/runs HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                sockets.append(s)
            # A body that trickles: refused once it is late, not waited for.
            trickle = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sockets.append(trickle)
            key = tenant.http.headers["Authorization"]
            trickle.sendall(
                b"PUT /v1/agents/x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000\r\nAuthorization: " + key.encode() + b"\r\n\r\n{"
            )
            started = time.monotonic()
            for _ in range(10):
                time.sleep(0.2)
                for s in sockets[:-1]:
                    s.sendall(b"a")
            answer = trickle.recv(4096)
            assert b" 408 " in answer.split(b"\r\n", 1)[0], answer[:200]
            assert time.monotonic() - started < 5
        assert tenant.http.get("/healthz").status_code == 200
        assert httpx.get(f"{server.url}/v1/agents/x", timeout=5).status_code == 401
    finally:
        for s in sockets:
            s.close()
        tenant.close()


def test_a_request_head_past_16_kib_is_refused_and_not_read_on(server: Server) -> None:
    """A request line and headers are bounded (uvicorn's httptools protocol read any length:
    a 2 MiB header was answered 200): past 16 KiB the answer is 431, problem+json, and the
    connection is closed rather than read on."""
    tenant = Tenant(server, "heads", "runs:read")
    key = tenant.http.headers["Authorization"].encode()
    head = b"GET /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: " + key + b"\r\n"
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(head + b"X-Pad: " + b"a" * 15_000 + b"\r\n\r\n")  # within the bound
            assert s.recv(4096).startswith(b"HTTP/1.1 200 ")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(head + b"X-Big: " + b"a" * 20_000)  # never ends
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
        status, _, rest = answer.partition(b"\r\n")
        assert status == b"HTTP/1.1 431 Request Header Fields Too Large"
        assert b"content-type: application/problem+json" in rest
        assert json.loads(rest.split(b"\r\n\r\n", 1)[1])["status"] == 431
        # A head that keeps coming is cut off, not buffered: the server closes the connection.
        sent = 0
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=10) as s,
            pytest.raises(OSError),  # a reset or a broken pipe
        ):
            s.sendall(head + b"X-Flood: ")
            while sent < 256 * 1024 * 1024:
                s.sendall(b"a" * 65536)
                sent += 65536
        assert sent < 64 * 1024 * 1024
        assert tenant.http.get("/v1/runs").status_code == 200
    finally:
        tenant.close()


def test_a_request_pipelined_behind_a_large_body_is_not_refused_as_a_long_head(
    server: Server,
) -> None:
    """The bound counts a head's bytes, not the body of the request before it: a client that
    pipelines a request behind one with a 40 KB body, both in one write, gets both answered
    (the bound once counted the whole read against the second request's head)."""
    tenant = Tenant(server, "pipelined", "runs:read")
    key = tenant.http.headers["Authorization"].encode()
    body = json.dumps({"agentName": "nope", "input": {"pad": "a" * 40_000}}).encode()
    first = (
        b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: " + key + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    second = b"GET /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: " + key + b"\r\n"
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(first + second)  # the second's head not yet ended
            time.sleep(0.2)
            s.sendall(b"Connection: close\r\n\r\n")
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        # A runs:read key may not create runs: 403, then the listing.
        assert re.findall(rb"HTTP/1\.1 (\d{3}) ", answer) == [b"403", b"200"], answer[:300]
    finally:
        tenant.close()
