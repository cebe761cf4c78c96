"""Per-step retry policy (``node.data.retry``) and step timeouts (``node.data.timeoutMs``).

``maxAttempts`` counts every attempt, the first included. Model and connector steps that say
nothing are retried on transient errors (a connection reset, a timeout, 408, 409, 429, a 5xx:
the errors marked retryable) up to 3 attempts from 500 ms of backoff; ``maxAttempts: 1``
turns that off. Other steps default to one attempt. Between
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
# Steps that call a model or a peer over the network: a blip should not fail the run.
TRANSIENT_KINDS = frozenset({"ai-step", "connector", "model"})


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 1
    backoff_ms: int = 0
    classes: frozenset[str] = frozenset({"any"})

    @classmethod
    def of(cls, data: Mapping[str, Any], kind: str | None = None) -> RetryPolicy:
        """The policy of a node's data (validated by the graph parser); ``kind``, the node's
        type (``model`` for a plain agent's turns), picks the default when it has none."""
        retry = data.get("retry")
        if not isinstance(retry, Mapping):
            return TRANSIENT if kind in TRANSIENT_KINDS else cls()
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


TRANSIENT = RetryPolicy(3, 500, frozenset({"any"}))


def timeout_s(
    data: Mapping[str, Any], agent_ms: int | None = None, default_s: float | None = None
) -> float | None:
    """A step's time limit: the node's ``timeoutMs``, else the agent's, else the server's
    ``LANTERN_STEP_TIMEOUT``."""
    for value in (data.get("timeoutMs"), agent_ms):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value / 1000
    return default_s
