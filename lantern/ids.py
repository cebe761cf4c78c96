"""Identifiers: run ids that sort by creation time, and idempotency keys."""

from __future__ import annotations

import hashlib
import secrets
import time


def new_run_id() -> str:
    # Millisecond prefix keeps ids roughly time-ordered, which keeps B-tree inserts local.
    return f"run_{int(time.time() * 1000):012x}{secrets.token_hex(8)}"


def new_signal_id() -> str:
    """A signal's id: time-prefixed as a run's is (docs/signals.md)."""
    return f"sig_{int(time.time() * 1000):012x}{secrets.token_hex(8)}"


def idempotency_key(run_id: str, step_id: str, attempt: int) -> str:
    """The key every side effect of one step attempt carries: sha256("runID|stepID|attempt")."""
    return hashlib.sha256(f"{run_id}|{step_id}|{attempt}".encode()).hexdigest()


def child_run_id(parent_id: str, step_id: str, attempt: int) -> str:
    """The run a subagent step attempt starts: derived, so a re-drive finds it, never a twin.

    It keeps the parent's time prefix, so children sort next to their parent.
    """
    digest = hashlib.sha256(f"{parent_id}|{step_id}|{attempt}".encode()).hexdigest()
    return f"{parent_id[:16]}{digest[:16]}"
