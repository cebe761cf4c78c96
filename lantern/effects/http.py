"""The http delivery: one request carrying the step attempt's Idempotency-Key, and a
Lantern-Signature over the exact body bytes when the workspace has a signing secret."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import httpx

from lantern import outbound
from lantern.effects import signing
from lantern.errors import StepError
from lantern.observability import tracing


def _body_bytes(method: str, body: Any, headers: dict[str, str]) -> bytes:
    """Serialise the body once: these bytes are what is signed and what goes on the wire."""
    if body is None or method in ("GET", "HEAD"):
        return b""
    if isinstance(body, str):
        return body.encode()
    try:
        # As httpx's json= encodes it, so an unsigned request is what it always was.
        raw = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StepError(
            f"http connector: body is not JSON: {exc}", error_class="connector"
        ) from exc
    if not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"
    return raw.encode()


async def send(
    client: httpx.AsyncClient,
    *,
    method: str,
    url: Any,
    headers: dict[str, str],
    body: Any,
    idempotency_key: str,
    timeout_s: float,
    signing_secrets: Sequence[str] = (),
) -> dict[str, Any]:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise StepError(
            f"http connector: url {url!r} is not an http(s) URL", error_class="connector"
        )
    request_headers = {str(k): str(v) for k, v in headers.items()}
    request_headers["Idempotency-Key"] = idempotency_key
    tracing.inject_headers(request_headers)  # the step's span, when tracing is on
    content = _body_bytes(method, body, request_headers)
    if signing_secrets:
        # Ours alone: a user header of the same name (any case) would travel beside it.
        for name in [k for k in request_headers if k.lower() == signing.HEADER.lower()]:
            del request_headers[name]
        request_headers[signing.HEADER] = signing.sign(signing_secrets, content)
    try:
        # The step's timeout starts once the request holds its host's slot, when it is sent.
        async with outbound.QUEUES.slot(outbound.host_of(url)), asyncio.timeout(timeout_s):
            response = await client.request(
                method,
                url,
                headers=request_headers,
                content=content or None,
                timeout=outbound.timeout(timeout_s),
            )
    except (httpx.TimeoutException, TimeoutError) as exc:
        raise StepError(
            f"http connector: {method} {url} timed out", error_class="timeout", retryable=True
        ) from exc
    except httpx.HTTPError as exc:
        raise StepError(
            f"http connector: {method} {url} failed: {type(exc).__name__}: {exc}",
            error_class="connector",
            retryable=True,
        ) from exc
    text = response.text
    if not response.is_success:
        retryable = response.status_code >= 500 or response.status_code in (408, 409, 429)
        raise StepError(
            f"http connector: {method} {url} answered {response.status_code}: {text[:500]}",
            error_class="connector",
            retryable=retryable,
        )
    result: dict[str, Any] = {"status": response.status_code}
    try:
        result["body"] = response.json() if text else None
    except ValueError:
        result["body"] = text
    return result
