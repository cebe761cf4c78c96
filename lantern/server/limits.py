"""The edge of the app: refusals made before a request reaches a route (bodies too large or
not JSON, NUL characters), and a last catch so an unexpected error never drops a connection.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lantern import limits
from lantern.server.problems import problem

log = logging.getLogger("lantern.server")


class _TooLarge(BaseException):  # not Exception: the framework must not turn it into a 400
    pass


class Guard:
    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_body_bytes
        self.body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await problem(*refusal)(scope, receive, send)
            return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            # The body whole, before a route parses it: JSON nested past the depth limit is
            # refused here, at every route's parse, rather than recursing through the app.
            try:
                async with asyncio.timeout(self.body_timeout):
                    body, disconnected = await self._read(receive)
            except _TooLarge:
                await problem(413, self._too_large)(scope, receive, send)
                return
            except TimeoutError:  # a client trickling its body (slowloris) holds nothing long
                detail = f"the request body did not arrive within {self.body_timeout:g} s"
                await problem(408, detail)(scope, receive, send)
                return
            if limits.json_too_deep(body):
                detail = f"the request body nests deeper than the limit of {limits.MAX_JSON_DEPTH}"
                await problem(422, detail)(scope, receive, send)
                return
            receive = _replay(body, disconnected, receive)
        else:
            # Another method's body (a GET with one, rare) is counted as the app reads it.
            receive = self._limited(receive)
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except _TooLarge:
            if not started:
                await problem(413, self._too_large)(scope, receive, send)
        except Exception as exc:
            # The app's own handler has answered 500 already; re-raising would make the
            # server drop the keep-alive connection under the client.
            log.error("%s %s failed", scope["method"], scope["path"], exc_info=exc)
            if not started:
                await problem(500, "the server could not complete the request")(
                    scope, receive, send
                )

    def _limited(self, receive: Receive) -> Receive:
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        return limited_receive

    async def _read(self, receive: Receive) -> tuple[bytes, bool]:
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"".join(chunks), True
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), False

    @property
    def _too_large(self) -> str:
        return f"the request body is larger than {self.max_bytes} bytes"

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        headers = dict(scope["headers"])
        raw_path = scope.get("raw_path") or scope["path"].encode()
        if _has_nul(raw_path) or _has_nul(scope.get("query_string", b"")):
            return 422, "NUL characters are not accepted in the path or the query"
        declared = headers.get(b"content-length")
        if declared is not None and not declared.isdigit():
            return 400, "the Content-Length header is not a number"
        if declared is not None and int(declared) > self.max_bytes:
            return 413, self._too_large
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        has_body = declared not in (None, b"0") or b"transfer-encoding" in headers
        is_json = content_type == b"application/json" or content_type.endswith(b"+json")
        if has_body and scope["method"] in ("POST", "PUT", "PATCH") and not is_json:
            return 400, "the request body must be application/json"
        return None


def _has_nul(raw: bytes) -> bool:
    """A NUL byte, sent as is or percent-encoded: decoding only what may hold one."""
    return b"\x00" in raw or (b"%00" in raw and b"\x00" in unquote_to_bytes(raw))


def _replay(body: bytes, disconnected: bool, receive: Receive) -> Receive:
    """A receive that gives the body already read, then whatever the client sends next."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if not given:
            given = True
            if disconnected:
                return {"type": "http.disconnect"}
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
