"""The http delivery: one request carrying the step attempt's Idempotency-Key."""

from __future__ import annotations

from typing import Any

import httpx

from lantern.errors import StepError


async def send(
    client: httpx.AsyncClient,
    *,
    method: str,
    url: Any,
    headers: dict[str, str],
    body: Any,
    idempotency_key: str,
    timeout_s: float,
) -> dict[str, Any]:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise StepError(
            f"http connector: url {url!r} is not an http(s) URL", error_class="connector"
        )
    request_headers = {str(k): str(v) for k, v in headers.items()}
    request_headers["Idempotency-Key"] = idempotency_key
    kwargs: dict[str, Any] = {}
    if body is not None and method not in ("GET", "HEAD"):
        if isinstance(body, str):
            kwargs["content"] = body.encode()
        else:
            kwargs["json"] = body
    try:
        response = await client.request(
            method, url, headers=request_headers, timeout=timeout_s, **kwargs
        )
    except httpx.TimeoutException as exc:
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
