"""The http delivery: one request carrying the step attempt's Idempotency-Key, and a
Lantern-Signature over the exact body bytes when the workspace has a signing secret.

The client it is given checks every connection against the egress policy (effects/egress.py);
here the answer is bounded: its size (read as a stream), the whole request's time, and the
nesting of a JSON body."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import httpx

from lantern import limits, outbound
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
    follow_redirects: bool = False,
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
        request_headers[signing.HEADER] = signing.sign(
            signing_secrets, content, method=method, url=url, delivery=idempotency_key
        )
    try:
        # timeout_s bounds the whole request, not each read: a peer trickling a byte a second
        # would otherwise hold the step for ever.
        # ... and starts once the request holds its host's slot, when it is sent: waiting for
        # a slot (lantern.outbound) never spends it.
        async with outbound.QUEUES.slot(outbound.host_of(url)), asyncio.timeout(timeout_s):
            status, text = await _exchange(
                client, method, url, request_headers, content, timeout_s, follow_redirects
            )
    except TimeoutError as exc:
        raise StepError(
            f"http connector: {method} {url} timed out after {timeout_s:g} s",
            error_class="timeout",
            retryable=True,
        ) from exc
    except httpx.TimeoutException as exc:
        raise StepError(
            f"http connector: {method} {url} timed out", error_class="timeout", retryable=True
        ) from exc
    except httpx.TooManyRedirects as exc:
        raise StepError(
            f"http connector: {method} {url}: too many redirects", error_class="connector"
        ) from exc
    except httpx.HTTPError as exc:
        raise StepError(
            f"http connector: {method} {url} failed: {type(exc).__name__}: {exc}",
            error_class="connector",
            retryable=True,
        ) from exc
    if not 200 <= status < 300:
        retryable = status >= 500 or status in (408, 409, 429)
        raise StepError(
            f"http connector: {method} {url} answered {status}: {text[:500]}",
            error_class="connector",
            retryable=retryable,
        )
    result: dict[str, Any] = {"status": status}
    try:
        result["body"] = limits.loads(text) if text else None
    except limits.TooDeep as exc:
        raise StepError(
            f"http connector: {method} {url} answered {exc}", error_class="connector"
        ) from None
    except ValueError:
        result["body"] = text
    return result


async def _exchange(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    headers: dict[str, str],
    content: bytes,
    timeout_s: float,
    follow_redirects: bool,
) -> tuple[int, str]:
    """The answer's status and text, read as a stream and refused past the size limit."""
    limit = limits.MAX_RESPONSE_BYTES
    async with client.stream(
        method,
        url,
        headers=headers,
        content=content or None,
        timeout=outbound.timeout(timeout_s),
        follow_redirects=follow_redirects,
    ) as response:
        declared = response.headers.get("content-length", "")
        if (
            declared.isdigit()
            and int(declared) > limit
            and not response.headers.get("content-encoding")
        ):
            raise _too_large(method, url, limit)
        chunks: list[bytes] = []
        seen = 0
        async for chunk in response.aiter_bytes():  # decoded: a gzip bomb is counted inflated
            seen += len(chunk)
            if seen > limit:
                raise _too_large(method, url, limit)
            chunks.append(chunk)
        raw = b"".join(chunks)
        return response.status_code, raw.decode(response.encoding or "utf-8", errors="replace")


def _too_large(method: str, url: str, limit: int) -> StepError:
    return StepError(
        f"http connector: {method} {url} answered more than the response size limit of "
        f"{limit} bytes",
        error_class="connector",
    )
