"""Prometheus metrics of this process, served at /metrics."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

SWEEPS = Counter("lantern_recovery_sweeps", "Recovery sweep passes")
ORPHANS_FOUND = Counter("lantern_recovery_orphans_found", "Runs found with no live lease")
LEASES_STOLEN = Counter("lantern_recovery_leases_stolen", "Expired or absent leases won by a sweep")
RECOVERIES = Counter("lantern_recoveries", "Runs re-driven after a crash or a lost executor")
RECOVERY_LATENCY = Histogram(
    "lantern_recovery_latency_seconds",
    "From the expiry of a lost lease to the re-drive of its run",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900),
)
