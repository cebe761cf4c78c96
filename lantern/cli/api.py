"""``Api``: the command line's client of a Lantern server, one blocking request at a time.

A command answers in one process start, so its client is the standard library's
``http.client`` over one kept-alive connection, with no event loop: the SDK's ``AsyncClient``
costs a command about 0.2 s of CPU in imports (httpx, anyio, asyncio) before its first byte,
most of its start (bench/cli.py). The answers and errors are still the SDK's: paths, queries
and typed results go through ``lantern.sdk.wire`` as the SDK's do (``seg``, ``parsed`` with
``lantern.sdk.models``' ``from_json``), an error answer raises the ``lantern.sdk.errors`` tree
(so the command prints it as one line), and requests are retried as ``lantern/sdk/retry.py``
says.

    with Api(url, key) as api:
        run = parsed(Run.from_json, api.get(f"/v1/runs/{seg(run_id)}"))
        api.post(f"/v1/runs/{seg(run_id)}/cancel")

Through a ``proxy`` (an http:// URL, ``user:password@`` allowed; ``lantern.cli.common`` takes
the one the environment names): an https:// server through a ``CONNECT`` tunnel, TLS end to
end; an http:// one with requests in absolute form.
"""

from __future__ import annotations

import base64
import http.client
import json
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self
from urllib.parse import SplitResult, unquote, urlencode, urlsplit

from lantern.errors import UsageError
from lantern.sdk.errors import ConnectionFailed, InvalidResponse, error_from_body
from lantern.sdk.retry import Backoff, parse_retry_after, retry_status, retry_transport
from lantern.sdk.wire import param

USER_AGENT = "lantern-cli"


class Api:
    """A connection to the server at ``base_url`` with one API key (hence one workspace).

    ``get``/``post``/``put``/``delete`` take a path under the server's address and answer the
    response's JSON (None for a 204). ``safe`` requests (every GET; a POST or PUT only when
    its caller says so, as one that carries an ``Idempotency-Key``) are retried on a transport
    error, 429, 502, 503 and 504; the others only when the request provably never left, or on a
    429. ``timeout`` bounds each read and connect, in seconds."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        proxy: SplitResult | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        # Messages show the URL without any user:password in it: they reach terminals and logs.
        shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"the Lantern server URL must start with http:// or https://: {shown}")
        self.base_url = shown.rstrip("/")
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = Backoff()
        self._scheme = parts.scheme
        self._host = parts.hostname
        try:
            self._port = parts.port
        except ValueError as exc:
            raise UsageError(f"the Lantern server URL has a bad port: {shown}") from exc
        self._prefix = parts.path.rstrip("/")
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }
        self._connection: http.client.HTTPConnection | None = None
        self._proxy = proxy
        # An http:// server through a proxy is asked for absolute URLs; an https:// one is
        # reached through a tunnel, and its requests are as if direct.
        self._origin = ""
        self._tunnel_headers: dict[str, str] = {}
        if self._proxy is not None:
            auth = _proxy_authorization(self._proxy)
            if parts.scheme == "http":
                self._origin = f"http://{parts.netloc.rpartition('@')[2]}"
                self._headers.update(auth)
            else:
                self._tunnel_headers = auth

    def __repr__(self) -> str:
        return f"Api({self.base_url!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def get(self, path: str, params: Mapping[str, Any] | None = None, *, extra: float = 0) -> Any:
        """The answer to a GET; ``params`` that are None are left out. ``extra`` seconds are
        added to the timeout (a long-poll's ``wait``)."""
        return self.send("GET", path, params=params, safe=True, extra=extra)

    def post(
        self,
        path: str,
        body: Any = None,
        *,
        headers: Mapping[str, str] | None = None,
        safe: bool = False,
        params: Mapping[str, Any] | None = None,
        extra: float = 0,
    ) -> Any:
        return self.send(
            "POST", path, body=body, headers=headers, safe=safe, params=params, extra=extra
        )

    def put(self, path: str, body: Any) -> Any:
        return self.send("PUT", path, body=body)

    def delete(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        return self.send("DELETE", path, params=params)

    def send(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        safe: bool = False,
        extra: float = 0,
    ) -> Any:
        """Send, retrying as ``lantern/sdk/retry.py`` says; the answer's JSON, or the error
        it maps to."""
        target = self._origin + self._prefix + path
        query = {k: param(v) for k, v in (params or {}).items() if v is not None}
        if query:
            target += "?" + urlencode(query)
        sent_headers = dict(self._headers)
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            sent_headers["Content-Type"] = "application/json"
        sent_headers.update(headers or {})
        attempt = 0
        while True:
            try:
                status, retry_after, text = self._exchange(
                    method, target, payload, sent_headers, extra
                )
            except _Unsent as exc:
                if attempt >= self.max_retries or not exc.retried:
                    raise self._failed(method, path, exc.__cause__, attempt) from exc.__cause__
                delay = self.backoff.delay(attempt)
            except (OSError, http.client.HTTPException) as exc:
                if attempt >= self.max_retries or not retry_transport(safe=safe, sent=True):
                    raise self._failed(method, path, exc, attempt) from exc
                delay = self.backoff.delay(attempt)
            else:
                if status == 204:  # a delete: nothing to answer
                    return None
                if 200 <= status < 300:
                    try:
                        return json.loads(text)
                    except ValueError as exc:
                        raise InvalidResponse(f"{method} {path}: {status} is not JSON") from exc
                if attempt >= self.max_retries or not retry_status(status, safe=safe):
                    raise error_from_body(status, text)
                delay = self.backoff.delay(attempt, parse_retry_after(retry_after))
            attempt += 1
            time.sleep(delay)

    def _exchange(
        self, method: str, target: str, payload: bytes | None, headers: dict[str, str], extra: float
    ) -> tuple[int, str | None, str]:
        """One request and its whole answer: status, Retry-After and body."""
        connection = self._connection
        if connection is None:
            kind = (
                http.client.HTTPSConnection
                if self._scheme == "https"
                else http.client.HTTPConnection
            )
            proxy = self._proxy
            if proxy is None:
                connection = kind(self._host, self._port, timeout=self.timeout)
            else:
                connection = kind(proxy.hostname or "", proxy.port or 80, timeout=self.timeout)
                if self._scheme == "https":
                    connection.set_tunnel(self._host, self._port, headers=self._tunnel_headers)
            try:
                connection.connect()
            except OSError as exc:  # refused, unresolvable, timed out: nothing was sent
                connection.close()
                # A certificate refused is a configuration mistake, not a passing failure.
                raise _Unsent(retried=type(exc).__name__ != "SSLCertVerificationError") from exc
            self._connection = connection
        try:
            if connection.sock is not None:  # a long-poll waits `extra` longer for its answer
                connection.sock.settimeout(self.timeout + extra)
            connection.request(method, target, body=payload, headers=headers)
            response = connection.getresponse()
            text = response.read().decode("utf-8", "replace")
        except BaseException:
            self.close()  # a broken or half-read connection is never used again
            raise
        if response.will_close:
            self.close()
        return response.status, response.getheader("Retry-After"), text

    def _failed(
        self, method: str, path: str, exc: BaseException | None, attempt: int
    ) -> ConnectionFailed:
        tries = f" (after {attempt + 1} attempts)" if attempt else ""
        what = type(exc).__name__ if exc is not None else "error"
        detail = f"{what}: {exc}" if exc is not None and str(exc) else what
        return ConnectionFailed(f"{method} {self.base_url}{path}: {detail}{tries}")


def _proxy_authorization(proxy: SplitResult) -> dict[str, str]:
    if proxy.username is None:
        return {}
    pair = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}"
    return {"Proxy-Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}


class _Unsent(Exception):
    """The connection could not be made: the request provably never left."""

    def __init__(self, *, retried: bool) -> None:
        super().__init__()
        self.retried = retried
