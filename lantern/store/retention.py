"""Reading large outputs back, and deleting finished runs (docs/retention.md).

A step output over 16 KiB lives once in ``blobs``, by content; a run may read a blob only
through a reference its own journal holds. Retention deletes finished runs whole: each
``delete_runs`` call is one transaction, so no run is ever seen half-deleted, and it touches
only finished runs' rows (and blobs no remaining event references), so a run in flight never
waits on it for a lock it needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

RETENTION = "retention"  # the named lease of the replica that runs the retention passes


@dataclass(frozen=True)
class Deleted:
    """What one deletion transaction removed."""

    runs: tuple[str, ...]  # the runs deleted (a run that was not finished is left alone)
    rows: int = 0  # rows of every table: runs, events, deliveries, approvals, receipts, blobs...
    bytes: int = 0  # the bytes of the events' data and of the blobs removed
    blobs: int = 0


@dataclass(frozen=True)
class StorageGauges:
    oldest_finished: datetime | None  # when the oldest finished run still kept finished
    database_bytes: int | None  # the database's size, where the backend can tell


class RetentionStore(Protocol):
    # The share of the database's writing a retention pass may take: after each deletion
    # transaction the pass waits long enough to keep to it (1.0: no wait). A backend whose
    # transactions wait on each other (SQLite's one writer) gives less.
    retention_share: float

    async def blob(self, run_id: str, digest: str) -> bytes | None:
        """The stored bytes of ``digest`` when an event of ``run_id`` references it."""

    async def workspace_retention(self, workspace: str) -> float | None:
        """The workspace's own retention in seconds, or None when it has none."""

    async def set_workspace_retention(self, workspace: str, seconds: float | None) -> None:
        """Set (or, with None, clear) the workspace's own retention."""

    async def expired_runs(self, default_s: float | None, limit: int) -> list[str]:
        """Finished runs longer finished than their workspace's retention (or ``default_s``
        where the workspace has none), oldest first, at most ``limit``. A run one of whose
        sub-agent runs is unfinished waits for it (deleting it would touch a live run's row)."""

    async def delete_runs(self, run_ids: Sequence[str]) -> Deleted:
        """Delete these runs, those of them that are finished, with their events, deliveries,
        approvals, signals, receipt, VMs and lease, unlink their sub-agent runs, and delete the
        blobs no remaining event references: all in one transaction."""

    async def storage_gauges(self) -> StorageGauges: ...
