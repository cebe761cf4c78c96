"""The command line's blocking client (``lantern.cli.api.Api``) against a real HTTP peer on
127.0.0.1: what it sends, which answers it retries, and the SDK's errors it raises."""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trustme

from lantern.cli.api import Api
from lantern.cli.common import server
from lantern.errors import LanternError, UsageError
from lantern.sdk.client import AsyncClient
from lantern.sdk.errors import ConnectionFailed, NotFoundError, ServerError, Unprocessable
from lantern.sdk.retry import Backoff
from lantern.sdk.sync import Client
from tests.proxy import forward_proxy


@dataclass
class Peer:
    """Answers each request with the next scripted (status, body, headers); records requests."""

    url: str
    answers: list[tuple[int, Any, dict[str, str]]] = field(default_factory=list)
    seen: list[dict[str, Any]] = field(default_factory=list)

    def script(self, status: int, body: Any = None, **headers: str) -> None:
        self.answers.append((status, body, headers))


@pytest.fixture
def peer() -> Iterator[Peer]:
    with serving() as found:
        yield found


@contextmanager
def serving(tls: ssl.SSLContext | None = None) -> Iterator[Peer]:
    """The peer on 127.0.0.1, over TLS with ``tls``."""
    found = Peer("")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn answers

        def answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            found.seen.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": dict(self.headers),
                    "body": json.loads(self.rfile.read(length)) if length else None,
                    "port": self.client_address[1],
                }
            )
            status, body, headers = found.answers.pop(0) if found.answers else (200, {}, {})
            data = b"" if status == 204 else json.dumps(body).encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name.replace("_", "-"), value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    scheme = "http" if tls is None else "https"
    found.url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()


def quick(api: Api) -> Api:
    api.backoff = Backoff(base=0.01, cap=0.02)
    return api


def test_requests_carry_the_key_and_json_and_share_one_connection(peer: Peer) -> None:
    peer.script(200, {"items": []})
    peer.script(200, {"decision": "approved"})
    peer.script(204)
    with Api(peer.url + "/base/", "lk_a_b") as api:
        assert api.get("/v1/runs", {"status": "waiting", "agentName": None, "x": True}) == {
            "items": []
        }
        assert api.post("/v1/runs/r%2F1/approvals/ok", {"decision": "approve"}) == {
            "decision": "approved"
        }
        assert api.delete("/v1/secrets/s") is None
    first, second, third = peer.seen
    assert first["path"] == "/base/v1/runs?status=waiting&x=true"
    assert first["headers"]["Authorization"] == "Bearer lk_a_b"
    assert first["body"] is None and "Content-Type" not in first["headers"]
    assert (second["method"], second["path"]) == ("POST", "/base/v1/runs/r%2F1/approvals/ok")
    assert second["headers"]["Content-Type"] == "application/json"
    assert second["body"] == {"decision": "approve"}
    assert third["method"] == "DELETE"
    assert first["port"] == second["port"] == third["port"]  # one kept-alive connection


def test_a_safe_request_is_retried_on_503_and_429_as_retry_after_says(peer: Peer) -> None:
    peer.script(503, {"title": "Service Unavailable"})
    peer.script(429, {"title": "Too Many Requests"}, Retry_After="0")
    peer.script(200, {"id": "run_1"})
    with quick(Api(peer.url, "k")) as api:
        assert api.get("/v1/runs/run_1") == {"id": "run_1"}
    assert len(peer.seen) == 3


def test_an_unsafe_request_is_not_retried_on_a_5xx_and_raises_the_sdk_error(peer: Peer) -> None:
    peer.script(503, {"title": "Service Unavailable", "detail": "draining"})
    with quick(Api(peer.url, "k")) as api, pytest.raises(ServerError, match="draining"):
        api.post("/v1/runs/run_1/cancel")
    assert len(peer.seen) == 1


def test_error_answers_map_to_the_sdk_tree(peer: Peer) -> None:
    peer.script(404, {"title": "Not Found", "detail": "run run_x not found"})
    peer.script(422, {"title": "Unprocessable", "errors": ["node 'a': unknown type"]})
    with Api(peer.url, "k") as api:
        with pytest.raises(NotFoundError, match="run run_x not found"):
            api.get("/v1/runs/run_x")
        with pytest.raises(Unprocessable) as refused:
            api.put("/v1/agents/a", {"name": "a"})
    assert refused.value.errors == ["node 'a': unknown type"]


def test_a_server_that_is_not_there_is_connection_failed_after_every_retry() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # A password in the URL is not the client's to show: the message names the host only.
    with quick(Api(f"http://ops:hunter2@127.0.0.1:{port}", "k", max_retries=2)) as api:
        refused = r"ConnectionRefusedError.*after 3 attempts"
        with pytest.raises(ConnectionFailed, match=refused) as e:
            api.post("/v1/runs/run_1/cancel")  # never sent, so even a cancel is retried
    assert f"http://127.0.0.1:{port}/v1/runs/run_1/cancel" in str(e.value)
    assert "hunter2" not in str(e.value) and "hunter2" not in repr(api)


@pytest.mark.parametrize(
    "url", ["ftp://host", "127.0.0.1:8787", "http://host:port", "http://u:hunter2@host:port"]
)
def test_a_bad_url_is_a_usage_error(url: str) -> None:
    with pytest.raises(UsageError, match="URL") as e:
        Api(url, "k")
    assert "hunter2" not in str(e.value)


@pytest.fixture
def no_proxy_settings(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The test's own proxy settings only: none of the machine's."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


def configured(monkeypatch: pytest.MonkeyPatch, url: str) -> Api:
    """The client a command gets for LANTERN_URL, with the environment's proxy."""
    monkeypatch.setenv("LANTERN_URL", url)
    monkeypatch.setenv("LANTERN_API_KEY", "k")
    api = server()
    assert api is not None
    return api


def test_an_http_server_is_reached_through_the_proxy_the_environment_names(
    peer: Peer, no_proxy_settings: pytest.MonkeyPatch
) -> None:
    with forward_proxy("ops", "p@ss") as proxy:
        no_proxy_settings.setenv("HTTP_PROXY", proxy.url.replace("//", "//ops:p%40ss@"))
        peer.script(200, {"items": []})
        with configured(no_proxy_settings, peer.url + "/base") as api:
            assert api.get("/v1/runs", {"limit": 2}) == {"items": []}
    # Asked of the proxy in absolute form, with its credentials; the server never sees them.
    assert proxy.seen == [("GET", f"{peer.url}/base/v1/runs?limit=2")]
    assert peer.seen[0]["path"] == "/base/v1/runs?limit=2"
    assert peer.seen[0]["headers"]["Authorization"] == "Bearer k"
    assert "Proxy-Authorization" not in peer.seen[0]["headers"]


def test_an_https_server_is_reached_through_a_tunnel_with_tls_to_the_server(
    tmp_path: Path, no_proxy_settings: pytest.MonkeyPatch
) -> None:
    ca = trustme.CA()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(tls)
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    no_proxy_settings.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    with serving(tls) as secure, forward_proxy("ops", "pw") as proxy:
        no_proxy_settings.setenv("https_proxy", proxy.url.replace("//", "//ops:pw@"))
        no_proxy_settings.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # http:// only: unused
        secure.script(200, {"id": "run_1"})
        secure.script(200, {"id": "run_2"})
        with configured(no_proxy_settings, secure.url) as api:
            assert api.get("/v1/runs/run_1") == {"id": "run_1"}
            assert api.get("/v1/runs/run_2") == {"id": "run_2"}
    host_port = secure.url.removeprefix("https://")
    assert proxy.seen == [("CONNECT", host_port)]  # one tunnel, kept for both requests
    assert [r["path"] for r in secure.seen] == ["/v1/runs/run_1", "/v1/runs/run_2"]


def test_no_proxy_reaches_the_server_directly_and_wrong_credentials_fail(
    peer: Peer, no_proxy_settings: pytest.MonkeyPatch
) -> None:
    with forward_proxy("ops", "pw") as proxy:
        no_proxy_settings.setenv("ALL_PROXY", proxy.url.replace("//", "//ops:wrong@"))
        with quick(configured(no_proxy_settings, peer.url)) as api:
            api.max_retries = 0
            with pytest.raises(LanternError, match="407"):
                api.get("/v1/runs")
        no_proxy_settings.setenv("NO_PROXY", "localhost,127.0.0.1")
        peer.script(200, {"items": []})
        with configured(no_proxy_settings, peer.url) as api:
            assert api.get("/v1/runs") == {"items": []}
    assert proxy.seen == [("GET", f"{peer.url}/v1/runs")]  # the refused one only
    assert [r["path"] for r in peer.seen] == ["/v1/runs"]


@pytest.mark.parametrize(
    ("setting", "problem"),
    [
        ("socks5://127.0.0.1:1080", "the proxy for http:// must be an http:// URL"),
        ("http://127.0.0.1:99999", "the proxy for http:// has a bad port"),
    ],
)
def test_a_proxy_setting_that_cannot_be_used_is_a_usage_error(
    setting: str, problem: str, no_proxy_settings: pytest.MonkeyPatch
) -> None:
    no_proxy_settings.setenv("HTTP_PROXY", setting)
    with pytest.raises(UsageError, match=problem):
        configured(no_proxy_settings, "http://127.0.0.1:1")
    # The SDK's clients too, when they are made (httpx's own answer to a SOCKS proxy was an
    # ImportError naming a package Lantern does not install).
    for client in (AsyncClient, Client):
        with pytest.raises(UsageError, match=problem):
            client("http://127.0.0.1:1", "lk_a_b")
