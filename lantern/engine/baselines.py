"""What an agent's recent runs spent, step by step and run by run: the baselines anomaly
detection compares a run's model usage with (``cost_spike``, ``token_spike``).

One per process, shared by every drive it runs (in-process runs and the microVM runs its
control plane serves), read from the store at most once a minute per agent.
"""

from __future__ import annotations

import time
from typing import Any

from lantern.engine.anomalies import RUN_TOTALS
from lantern.store.base import Store

FRESH_S = 60.0  # how long a baseline read from the store is used


class Baselines:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._read: dict[tuple[str, str], tuple[float, dict[str, list[Any]]]] = {}

    async def of(self, workspace: str, agent: str) -> dict[str, list[Any]]:
        """Recent usage of the agent's steps (by step id), and of its whole runs (under
        ``RUN_TOTALS``)."""
        cached = self._read.get((workspace, agent))
        if cached is not None and time.monotonic() - cached[0] < FRESH_S:
            return cached[1]
        found: dict[str, list[Any]] = {}
        runs: dict[str, dict[str, float]] = {}
        for run_id, step, usage in await self.store.recent_step_usage(workspace, agent):
            found.setdefault(step, []).append(usage)
            total = runs.setdefault(run_id, {"inputTokens": 0, "outputTokens": 0, "costUsd": 0})
            for field in total:
                total[field] += float(usage.get(field) or 0)
        found[RUN_TOTALS] = list(runs.values())
        self._read[(workspace, agent)] = (time.monotonic(), found)
        return found
