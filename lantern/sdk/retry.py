"""When the SDK retries a request, and how long it waits first. Pure: no I/O.

Safe calls (every GET, and ``POST /v1/runs``, which always carries an idempotency key) are retried
on a transport error and on 429, 502, 503 and 504. The other calls (cancel, approve, applying an
agent) are retried only when the request provably never left: the connection could not be made.
Waits grow exponentially with full jitter, and a ``Retry-After`` from the server wins.

Which transport errors mean "never sent" is the HTTP library's to say: ``client.py`` for the
SDK's httpx, ``lantern/cli/api.py`` for the command line's ``http.client``. This module imports
neither, so the command line pays for no HTTP library it does not use.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

RETRY_STATUSES = frozenset({429, 502, 503, 504})

_random = random.Random()


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: attempt ``n`` waits U(0, min(cap, base * 2**n))."""

    base: float = 0.2
    cap: float = 5.0
    # The longest Retry-After the client honours; a longer one is cut to this.
    max_retry_after: float = 60.0

    def ceiling(self, attempt: int) -> float:
        """The longest wait before retry number ``attempt + 1`` (``attempt`` counts from 0)."""
        return min(self.cap, self.base * 2.0 ** min(attempt, 62))

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after)
        return _random.random() * self.ceiling(attempt)


def retry_transport(*, safe: bool, sent: bool) -> bool:
    """Whether a transport error is worth another attempt: always for a safe call, and for any
    call when the request provably never left (``sent`` False)."""
    return safe or not sent


def retry_status(status: int, *, safe: bool) -> bool:
    # A 429 was refused before anything was done, so even an unsafe call may try again.
    return status == 429 or (safe and status in RETRY_STATUSES)


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)
