"""A run's statuses: what the store keeps and what the API client reads, in a module of its own
so the client (and the CLI through it) need not import the store's records."""

from __future__ import annotations

from typing import Literal

RunStatus = Literal["queued", "running", "waiting", "succeeded", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
