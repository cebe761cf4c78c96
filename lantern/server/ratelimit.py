"""Requests per API key: a token bucket per key, in this process (docs/security.md).

Every replica keeps its own buckets, so N replicas behind a balancer allow up to N times the
rate; that bounds what one key can make one process do, which is the point: one tenant's
script in a loop must not starve the rest. ``LANTERN_RATE_LIMIT`` is requests per second per
key (default 1,000, bursts of twice that: above what a client that waits for its runs sends,
see docs/operations.md); 0 turns it off. ``Streams`` bounds what a key holds open at once:
``LANTERN_STREAMS_PER_KEY`` (default 256, see docs/operations.md) streams and long-polls together.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from lantern.errors import LanternError

MAX_KEYS = 100_000  # buckets kept; the oldest are forgotten (a full bucket is no loss)


class RateLimited(LanternError):
    """Answered 429 with Retry-After."""

    def __init__(self, retry_after: float, rate: float) -> None:
        self.retry_after = max(1, math.ceil(retry_after))
        super().__init__(
            f"this key is over its request rate of {rate:g}/s (LANTERN_RATE_LIMIT); "
            f"retry in {self.retry_after} s"
        )


@dataclass
class Limiter:
    rate: float  # tokens per second; 0 = no limit
    burst: float = 0.0
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.burst = self.burst or 2 * self.rate

    def take(self, key_id: str) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic()
        tokens, at = self._buckets.pop(key_id, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens < 1:
            self._buckets[key_id] = (tokens, now)
            raise RateLimited((1 - tokens) / self.rate, self.rate)
        self._buckets[key_id] = (tokens - 1, now)  # re-inserted: dict order is recency
        if len(self._buckets) > MAX_KEYS:
            del self._buckets[next(iter(self._buckets))]


class StreamsExceeded(RateLimited):
    """One more open stream or long-poll than a key may hold (answered 429, Retry-After)."""

    def __init__(self, limit: int) -> None:
        self.retry_after = STREAM_RETRY_S
        LanternError.__init__(
            self,
            f"this key already holds {limit} open streams and long-polls "
            f"(LANTERN_STREAMS_PER_KEY); close one or retry in {self.retry_after} s",
        )


STREAM_RETRY_S = 5  # what Retry-After suggests: a stream ends when its run does or its client goes


@dataclass
class Streams:
    """Open ``/stream`` connections and ``?wait=`` long-polls per API key, in this process: each
    holds a connection and a subscription for as long as it lasts, so one key's hundreds would
    take the whole connection limit from ``/healthz`` and every other tenant."""

    per_key: int
    _open: dict[str, int] = field(default_factory=dict)

    def take(self, key_id: str) -> Callable[[], None]:
        """Hold a slot of ``key_id`` (StreamsExceeded when it has none left); the callable
        gives it back, once however often it is called."""
        held = self._open.get(key_id, 0)
        if held >= self.per_key:
            raise StreamsExceeded(self.per_key)
        self._open[key_id] = held + 1
        given = False

        def release() -> None:
            nonlocal given
            if given:
                return
            given = True
            left = self._open.get(key_id, 1) - 1
            if left > 0:
                self._open[key_id] = left
            else:
                self._open.pop(key_id, None)

        return release

    @contextmanager
    def hold(self, key_id: str) -> Iterator[None]:
        release = self.take(key_id)
        try:
            yield
        finally:
            release()
