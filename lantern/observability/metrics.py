"""Prometheus metrics of this process, served at /metrics.

Run, retry and failure counts come from the journal: every committed event is counted by kind
(``lantern_journal_events_total``), and the kinds that matter get a counter of their own, so a
new event kind (``step_retrying``) is counted the day it is first journaled. This module knows
no event kind: the engine's commit path (``lantern.engine.journal.count``) names them and calls
the plain counters below.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

SWEEPS = Counter("lantern_recovery_sweeps", "Recovery sweep passes")
ORPHANS_FOUND = Counter("lantern_recovery_orphans_found", "Runs found with no live lease")
LEASES_STOLEN = Counter("lantern_recovery_leases_stolen", "Expired or absent leases won by a sweep")
RECOVERIES = Counter("lantern_recoveries", "Runs re-driven after a crash or a lost executor")
RECOVERY_LATENCY = Histogram(
    "lantern_recovery_latency_seconds",
    "From the expiry of a lost lease to the re-drive of its run",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900),
)

RUNS_STARTED = Counter("lantern_runs_started", "Runs this process started (run_started)")
RUNS_FINISHED = Counter(
    "lantern_runs_finished", "Runs this process finished, by final status", ["status"]
)
JOURNAL_EVENTS = Counter(
    "lantern_journal_events", "Journal events this process committed, by kind", ["kind"]
)
STEP_RETRIES = Counter("lantern_step_retries", "Step attempts retried (step_retrying)")
STEP_FAILURES = Counter("lantern_step_failures", "Step attempts that failed (step_failed)")
STEP_DURATION = Histogram(
    "lantern_step_duration_seconds",
    "Wall time of one step attempt in this process, by node type",
    ["node_type"],
    buckets=(
        0.0005,
        0.001,
        0.0025,
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1,
        2.5,
        5,
        10,
        30,
        60,
        300,
    ),
)
JOURNAL_WRITE = Histogram(
    "lantern_journal_write_seconds",
    "Latency of one journal append (one commit of a drive)",
    buckets=(
        0.0001,
        0.00025,
        0.0005,
        0.001,
        0.0025,
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1,
        2.5,
    ),
)
COMMIT_RETRIES = Counter(
    "lantern_commit_retries", "Journal commits sent again after the database was unavailable"
)
STORE_UNAVAILABLE = Counter(
    "lantern_store_unavailable", "Store calls that failed because the database was unavailable"
)
DELIVERIES = Counter(
    "lantern_deliveries",
    "Claimed deliveries by kind and outcome (replayed: answered from its receipt, not sent)",
    ["kind", "outcome"],
)
MODEL_TOKENS = Counter(
    "lantern_model_tokens",
    "Model tokens spent by this process's steps",
    ["provider", "model", "direction"],
)
MODEL_COST = Counter(
    "lantern_model_cost_usd", "Model cost in USD of this process's steps", ["provider", "model"]
)

# Label children cached by label: .labels() takes a lock and builds a tuple on every call.
_by_kind: dict[str, Any] = {}
_by_node: dict[str, Any] = {}
_by_status: dict[str, Any] = {}


def journal_event(kind: str) -> None:
    """One committed journal event of ``kind``."""
    child = _by_kind.get(kind)
    if child is None:
        child = _by_kind[kind] = JOURNAL_EVENTS.labels(kind)
    child.inc()


def run_finished(status: str) -> None:
    child = _by_status.get(status)
    if child is None:
        child = _by_status[status] = RUNS_FINISHED.labels(status)
    child.inc()


def step_duration(node_type: str, seconds: float) -> None:
    child = _by_node.get(node_type)
    if child is None:
        child = _by_node[node_type] = STEP_DURATION.labels(node_type)
    child.observe(seconds)


def model_usage(output: Any) -> None:
    """Tokens and cost of a step whose output says ``usage``, ``model`` and ``provider``."""
    if not isinstance(output, dict):
        return
    usage = output.get("usage")
    model, provider = output.get("model"), output.get("provider")
    if not (isinstance(usage, Mapping) and isinstance(model, str) and isinstance(provider, str)):
        return
    for key, direction in (("inputTokens", "input"), ("outputTokens", "output")):
        tokens = usage.get(key)
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
            MODEL_TOKENS.labels(provider, model, direction).inc(tokens)
    cost = usage.get("costUsd")
    if isinstance(cost, int | float) and not isinstance(cost, bool) and cost > 0:
        MODEL_COST.labels(provider, model).inc(cost)


def delivery(kind: str, outcome: str) -> None:
    DELIVERIES.labels(kind, outcome).inc()


# Read from the database at each scrape (every replica reports the same, shared numbers).
RUNS_ACTIVE = Gauge(
    "lantern_runs",
    "Unfinished runs, by workspace and status (queued running waiting)",
    ["workspace", "status"],
)
LEASES_HELD = Gauge("lantern_leases_held", "Run leases live now, across every replica")
OLDEST_QUEUED = Gauge(
    "lantern_oldest_queued_run_age_seconds", "How long the longest-queued run has waited (0: none)"
)


def set_gauges(
    runs: Mapping[tuple[str, str], int], leases_held: int, oldest_age_s: float | None
) -> None:
    RUNS_ACTIVE.clear()  # a workspace whose runs all finished leaves the report
    for (workspace, status), count in runs.items():
        RUNS_ACTIVE.labels(workspace=workspace, status=status).set(count)
    LEASES_HELD.set(leases_held)
    OLDEST_QUEUED.set(max(0.0, oldest_age_s or 0.0))
