"""Retention: finished runs deleted once they are older than their workspace's retention
(or ``LANTERN_RETENTION``), by one replica at a time, in bounded batches (docs/retention.md).

The replica that holds the named lease ``retention`` runs the passes; the lease only spares
the others the work (two replicas deleting the same run is harmless: each run goes whole in
one transaction, and the second finds nothing). A pass deletes ``per_transaction`` runs per
transaction, at most ``max_runs`` in all, and after each transaction leaves the database to
the runs in flight for a while (the store's ``retention_share``), so on SQLite, whose one
writer a transaction holds, runs in flight wait at most one small transaction now and then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import suppress
from dataclasses import dataclass

from lantern.errors import Conflict, NotFound
from lantern.observability import storage
from lantern.store.base import Store
from lantern.store.retention import RETENTION, Deleted

log = logging.getLogger("lantern.retention")

PER_TRANSACTION = 20  # runs deleted per transaction
MAX_RUNS = 2000  # runs one pass deletes at most; a full pass is followed by another soon


@dataclass(frozen=True)
class PassResult:
    runs: int = 0
    rows: int = 0
    bytes: int = 0
    full: bool = False  # the pass stopped at its bound: more runs are due


async def delete_finished_run(store: Store, run_id: str) -> Deleted:
    """``DELETE /v1/runs/{id}``: the run, finished, whole; Conflict while it is unfinished."""
    deleted = await store.delete_runs([run_id])
    if deleted.runs:
        storage.deleted(len(deleted.runs), deleted.rows, deleted.bytes)
        return deleted
    run = await store.get_run(run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found")
    if not run.finished:
        raise Conflict(f"run {run_id} is {run.status}: only a finished run can be deleted")
    raise Conflict(f"run {run_id} has a sub-agent run still unfinished: delete it once that ends")


async def retention_pass(
    store: Store,
    default_s: float | None,
    *,
    per_transaction: int = PER_TRANSACTION,
    max_runs: int = MAX_RUNS,
) -> PassResult:
    """Delete the finished runs past retention, ``per_transaction`` at a time, up to
    ``max_runs``."""
    runs = rows = size = 0
    rest = (1 - store.retention_share) / store.retention_share
    while runs < max_runs:
        ids = await store.expired_runs(default_s, min(per_transaction, max_runs - runs))
        if not ids:
            break
        begun = time.perf_counter()
        deleted = await store.delete_runs(ids)
        # The runs in flight commit between transactions, for as long as the backend asks.
        await asyncio.sleep((time.perf_counter() - begun) * rest)
        storage.deleted(len(deleted.runs), deleted.rows, deleted.bytes)
        runs, rows, size = runs + len(ids), rows + deleted.rows, size + deleted.bytes
    storage.pass_done(rows, size)
    return PassResult(runs, rows, size, full=runs >= max_runs)


class RetentionLoop:
    """Runs a pass every ``interval`` while this replica holds the ``retention`` lease."""

    def __init__(
        self, store: Store, *, worker_id: str, default_s: float | None, interval: float
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.default_s = default_s
        self.interval = interval
        # Held across a few missed passes, so a busy holder keeps it; a lost one frees it soon.
        self.ttl = max(3 * interval, 30.0)

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            full = False
            try:
                if await self.store.acquire_named_lease(RETENTION, self.worker_id, self.ttl):
                    result = await retention_pass(self.store, self.default_s)
                    full = result.full
                    if result.runs:
                        log.info(
                            "retention deleted %d runs (%d rows, %d bytes)",
                            result.runs,
                            result.rows,
                            result.bytes,
                        )
            except Exception as exc:  # the database is away: the next pass tries again
                log.warning("retention pass failed: %s", exc)
            with suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), 1.0 if full else self.interval)
