"""Prometheus metrics of what the database keeps: the retention passes' deletions (counted by
the replica that ran them) and, read at each scrape, the oldest finished run kept and the
database's size."""

from __future__ import annotations

import time
from datetime import datetime

from prometheus_client import Counter, Gauge

PASSES = Counter("lantern_retention_passes", "Retention passes run by this process")
RUNS_DELETED = Counter("lantern_retention_runs_deleted", "Finished runs deleted by this process")
ROWS_DELETED = Counter(
    "lantern_retention_rows_deleted", "Rows deleted with those runs (events, blobs, ... included)"
)
BYTES_DELETED = Counter(
    "lantern_retention_bytes_deleted", "Bytes of event data and blobs deleted with those runs"
)
LAST_PASS_ROWS = Gauge("lantern_retention_last_pass_rows", "Rows the last retention pass deleted")
LAST_PASS_BYTES = Gauge(
    "lantern_retention_last_pass_bytes", "Bytes the last retention pass deleted"
)
OLDEST_FINISHED = Gauge(
    "lantern_oldest_finished_run_age_seconds",
    "Since when the oldest finished run still kept has been finished (0: none)",
)
DATABASE_BYTES = Gauge(
    "lantern_database_size_bytes", "The database's size as the backend reports it"
)


def deleted(runs: int, rows: int, size: int) -> None:
    """One deletion transaction's work."""
    RUNS_DELETED.inc(runs)
    ROWS_DELETED.inc(rows)
    BYTES_DELETED.inc(size)


def pass_done(rows: int, size: int) -> None:
    PASSES.inc()
    LAST_PASS_ROWS.set(rows)
    LAST_PASS_BYTES.set(size)


def set_storage(oldest_finished: datetime | None, database_bytes: int | None) -> None:
    age = 0.0 if oldest_finished is None else time.time() - oldest_finished.timestamp()
    OLDEST_FINISHED.set(max(0.0, age))
    if database_bytes is not None:
        DATABASE_BYTES.set(database_bytes)
