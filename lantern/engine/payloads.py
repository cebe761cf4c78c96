"""Typed payloads of the journal events the step ledger writes and reads.

One dataclass per kind, built in one place (``data()``) and read in one place (``of()``),
so a field written by one module and read by key in another cannot drift apart again (a
``step_retrying`` reported without ``dueAt`` once made a run's journal unfoldable).

``of()`` reads what any journal holds, including journals written before a field existed:
it never raises on a missing or malformed field, it falls back to a documented default.
The wire format (the ``data`` dict, its camelCase keys) is unchanged by these classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def _int(value: Any, default: int) -> int:
    if isinstance(value, bool):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _error(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class StepStarted:
    """``step_started``: the step's type (spans, metrics, model spend) and what else the kind
    of run names (a tool call, a function's name, a model, a sub-agent)."""

    type: str = "step"
    extra: Mapping[str, Any] = field(default_factory=dict)

    def data(self) -> dict[str, Any]:
        return {**self.extra, "type": self.type}

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> StepStarted:
        extra = {k: v for k, v in data.items() if k != "type"}
        return cls(cls.type_of(data), extra)

    @staticmethod
    def type_of(data: Mapping[str, Any]) -> str:
        """The type alone (what a fold needs of every start, without copying the rest)."""
        return str(data.get("type", "step"))


@dataclass(frozen=True)
class StepRetrying:
    """``step_retrying``: ``attempt`` is the attempt about to run (its step_started follows
    when ``due_at``, epoch ms, has come); ``of`` the policy's ``maxAttempts``."""

    attempt: int
    of: int
    error: dict[str, Any]
    delay_ms: int
    due_at: int

    def data(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "of": self.of,
            "error": self.error,
            "delayMs": self.delay_ms,
            "dueAt": self.due_at,
        }

    @classmethod
    def read(cls, data: Mapping[str, Any], attempt: int | None = None) -> StepRetrying:
        """A journaled retry; ``attempt`` is the event's own attempt column, used when the
        data lacks one. A retry without ``dueAt`` (written by an older microVM harness) is
        due at once: its backoff, if it had one, was waited out before it was reported."""
        next_attempt = _int(data.get("attempt"), attempt if attempt is not None else 2)
        return cls(
            attempt=next_attempt,
            of=_int(data.get("of"), next_attempt),
            error=_error(data.get("error")),
            delay_ms=_int(data.get("delayMs"), 0),
            due_at=_int(data.get("dueAt"), 0),
        )


@dataclass(frozen=True)
class StepThrottled:
    """``step_throttled``: the attempt's model call would pass rate limit ``limit``, so it was
    not made; the same attempt starts again (its step_started follows) when ``due_at``, epoch
    ms, has come (docs/rate-limits.md)."""

    limit: str
    wait_ms: int
    due_at: int

    def data(self) -> dict[str, Any]:
        return {"limit": self.limit, "waitMs": self.wait_ms, "dueAt": self.due_at}

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> StepThrottled:
        return cls(
            limit=str(data.get("limit", "")),
            wait_ms=_int(data.get("waitMs"), 0),
            due_at=_int(data.get("dueAt"), 0),
        )


@dataclass(frozen=True)
class StepFailed:
    """``step_failed``: the step's error (``StepError.to_json()``: message, class,
    retryable, and what else the error names)."""

    error: dict[str, Any]

    def data(self) -> dict[str, Any]:
        return {"error": self.error}

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> StepFailed:
        return cls(_error(data.get("error")))


@dataclass(frozen=True)
class AnomalyDetected:
    """``anomaly_detected``: what the detector found and the policy that applied."""

    kind: str
    detail: Any
    policy: str

    def data(self) -> dict[str, Any]:
        return {"kind": self.kind, "detail": self.detail, "policy": self.policy}

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> AnomalyDetected:
        return cls(str(data.get("kind", "")), data.get("detail"), str(data.get("policy", "")))


@dataclass(frozen=True)
class RunCancelled:
    """``run_cancelled``: who asked, and the steps (sync tools in threads) it waited for."""

    by: str = "request"
    uninterruptible: tuple[str, ...] = ()

    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"by": self.by}
        if self.uninterruptible:
            data["uninterruptible"] = sorted(self.uninterruptible)
        return data

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> RunCancelled:
        waited = data.get("uninterruptible")
        steps = tuple(str(s) for s in waited) if isinstance(waited, list) else ()
        return cls(str(data.get("by", "request")), steps)


@dataclass(frozen=True)
class RunRepinned:
    """``run_repinned``: an operator moved a code-first run to another version of its code."""

    version: str

    def data(self) -> dict[str, Any]:
        return {"version": self.version}

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> RunRepinned:
        return cls(str(data.get("version")))


@dataclass(frozen=True)
class SignalWait:
    """``step_waiting`` of a signal wait: the signal's ``name``, when it times out (``due_at``,
    epoch ms, None: never), and whether its output is a graph node's ``{received, payload}``
    (``envelope``) or the payload itself (a code-first ``ctx.wait_for_signal``)."""

    name: str
    due_at: int | None = None
    envelope: bool = False

    KIND = "signal"

    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.KIND, "name": self.name}
        if self.due_at is not None:
            data["dueAt"] = self.due_at
        if self.envelope:
            data["envelope"] = True
        return data

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> SignalWait | None:
        """The signal wait ``data`` is, or None for any other wait."""
        if data.get("kind") != cls.KIND:
            return None
        due = data.get("dueAt")
        return cls(
            str(data.get("name")),
            None if due is None else _int(due, 0),
            bool(data.get("envelope", False)),
        )

    def output(self, payload: Any, received: bool) -> Any:
        """The waiting step's output: what a wait that took ``payload`` (or timed out) returns."""
        if not self.envelope:
            return payload if received else None
        return {"received": True, "payload": payload} if received else {"received": False}


@dataclass(frozen=True)
class SignalReceived:
    """``signal_received``: a signal wait took the signal ``signal_id`` (docs/signals.md); its
    payload is the step's output, journaled in the same commit."""

    signal_id: str
    name: str

    def data(self) -> dict[str, Any]:
        return {"signalId": self.signal_id, "name": self.name}

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> SignalReceived:
        return cls(str(data.get("signalId")), str(data.get("name")))
