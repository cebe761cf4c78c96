"""Provider failures as step errors: class ``llm``, retryable as a provider would want.

Rate limits (429), timeouts (408), conflicts (409, e.g. a request with this Idempotency-Key
still in progress), 5xx and lost connections are worth another attempt; any other 4xx (a bad
request, a bad key, an unknown model) fails the same way every time. The provider's own
message is kept, because it is what a user needs to fix the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from lantern.errors import StepError

RETRYABLE_STATUS = frozenset({408, 409, 429})


def retryable_status(status: int) -> bool:
    return status >= 500 or status in RETRYABLE_STATUS


MAX_RETRY_AFTER_S = 300.0  # a longer Retry-After is read as this (a retry's longest wait)


def retry_after_ms(headers: Mapping[str, str] | None) -> int:
    """A provider's ``Retry-After`` (seconds, or an HTTP date) or ``retry-after-ms``, in ms;
    0 when it sends neither or something unreadable."""
    if not headers:
        return 0
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        with suppress(ValueError):
            return int(min(max(float(raw_ms), 0.0), MAX_RETRY_AFTER_S * 1000))
    raw = headers.get("retry-after")
    if raw is None:
        return 0
    try:
        seconds = float(raw)
    except ValueError:
        try:
            seconds = (parsedate_to_datetime(raw) - datetime.now(UTC)).total_seconds()
        except (TypeError, ValueError):
            return 0
    return int(min(max(seconds, 0.0), MAX_RETRY_AFTER_S) * 1000)


def status_error(
    provider: str,
    model: str,
    status: int,
    message: str,
    headers: Mapping[str, str] | None = None,
) -> StepError:
    """A provider's error answer; ``headers`` give the wait it asks for (a 429's Retry-After),
    which the retry honours."""
    return StepError(
        f"{provider} model {model!r} answered {status}: {message}",
        error_class="llm",
        retryable=retryable_status(status),
        retry_after_ms=retry_after_ms(headers),
    )


def connection_error(provider: str, model: str, message: str) -> StepError:
    return StepError(
        f"{provider} model {model!r}: no answer ({message})", error_class="llm", retryable=True
    )


def bad_answer(provider: str, model: str, message: str) -> StepError:
    return StepError(f"{provider} model {model!r}: {message}", error_class="llm", retryable=True)
