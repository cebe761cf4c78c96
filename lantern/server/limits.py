"""Refusals made before a request reaches a route: bodies too large, bodies not JSON."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lantern.server.problems import problem


class _TooLarge(BaseException):  # not Exception: the framework must not turn it into a 400
    pass


class BodyLimit:
    """413 for a body over ``max_bytes``: at once from Content-Length, else while it streams."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            status = 413 if declared.isdigit() else 400
            await problem(status, self._detail(status))(scope, receive, send)
            return
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        has_body = (declared not in (None, b"0")) or b"transfer-encoding" in headers
        if (
            has_body
            and scope["method"] in ("POST", "PUT", "PATCH")
            and not (content_type == b"application/json" or content_type.endswith(b"+json"))
        ):
            await problem(400, "the request body must be application/json")(scope, receive, send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await problem(413, self._detail(413))(scope, receive, send)

    def _detail(self, status: int) -> str:
        if status == 400:
            return "the Content-Length header is not a number"
        return f"the request body is larger than {self.max_bytes} bytes"
