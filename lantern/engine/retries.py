"""Per-step retry policy (``node.data.retry``) and step timeouts (``node.data.timeoutMs``).

``maxAttempts`` counts every attempt, the first included (default 1: no retry). Between
attempts the runner journals ``step_retrying {attempt, of, error, delayMs, dueAt}``, where
``attempt`` is the attempt about to run; the attempt number is part of the idempotency key,
so each attempt has its own. The due time is journaled, so a backoff survives a crash and the
retry count continues from the journal.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lantern.errors import StepError

MAX_BACKOFF_MS = 5 * 60 * 1000  # one wait between attempts is never longer than this


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 1
    backoff_ms: int = 0
    classes: frozenset[str] = frozenset({"any"})

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> RetryPolicy:
        """The policy of a node's data (validated by the graph parser)."""
        retry = data.get("retry")
        if not isinstance(retry, Mapping):
            return cls()
        # No classes named: every retryable error is retried, as Temporal and DBOS do.
        classes = retry.get("retryableClasses") or ["any"]
        return cls(
            int(retry.get("maxAttempts", 1)), int(retry.get("backoffMs", 0)), frozenset(classes)
        )

    def retries(self, error: StepError, attempt: int) -> bool:
        """Whether the attempt that failed with ``error`` gets another one.

        The error must be retryable in itself (a 400 never is) and of a class the policy names.
        """
        if attempt >= self.max_attempts or not error.retryable:
            return False
        return "any" in self.classes or error.error_class in self.classes

    def delay_ms(self, failed_attempt: int) -> int:
        """Exponential from ``backoffMs``, capped, with jitter in its upper half so that runs
        failing together do not all come back together."""
        if self.backoff_ms <= 0:
            return 0
        ceiling = min(MAX_BACKOFF_MS, self.backoff_ms * 2 ** min(failed_attempt - 1, 30))
        return int(ceiling / 2 + random.random() * ceiling / 2)


def timeout_s(data: Mapping[str, Any]) -> float | None:
    value = data.get("timeoutMs")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value / 1000
    return None
