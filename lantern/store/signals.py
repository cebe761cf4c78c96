"""Signals as stored (docs/signals.md), and the store role that keeps them.

A signal is stored when it is sent, before the API answers, and kept until its run is
deleted. Which wait took it is the journal's business (``signal_received`` names its id), not
the store's: the store keeps what arrived, in arrival order, and wakes a parked run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol


@dataclass(frozen=True)
class Signal:
    id: str
    run_id: str
    name: str
    payload: Any
    received_at: datetime


@dataclass(frozen=True)
class Added:
    """What ``add_signal`` did: the signal as stored, whether this call stored it (False: an
    earlier send under the same idempotency key did), and that send's request digest."""

    signal: Signal
    created: bool
    request_digest: str | None


class SignalStore(Protocol):
    async def add_signal(
        self,
        signal: Signal,
        *,
        idempotency_key: str | None,
        request_digest: str | None,
        limit: int,
        wake_after: int | None = None,
    ) -> Added:
        """Store ``signal`` for its run and make the run due if it is parked, in one
        transaction; with ``wake_after``, only if the run's journal has gone past that
        sequence number (the caller read it up to there and saw no wait for this signal). A
        signal already stored under ``idempotency_key`` for the run is returned as it is
        (whatever the run's state now). NotFound for an unknown run; Conflict for a finished
        one, or one holding ``limit`` signals already."""

    async def signals(self, run_id: str, name: str) -> list[Signal]:
        """The run's signals named ``name``, in the order they were received."""
