"""The recovery sweep (RunRecoveryLoop): find orphaned runs, steal their leases, re-drive them.

Every `lantern serve` runs one: a pass right after start, then every
``LANTERN_RECOVERY_INTERVAL``; a pass that came back full is followed at once by another while
the replica has free slots (or as soon as one frees up), so a replica lost with thousands of
runs is recovered at the rate the survivors can drive them, not 20 per interval. A pass finds
at most ``BATCH`` queued or running runs whose lease is absent or expired, oldest first, and
steals each lease with the UPSERT that wins only an expired lease (a new epoch, so the old
holder is fenced). Several replicas may sweep at
once: each orphan goes to exactly one, and the losers skip it silently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import suppress
from datetime import UTC, datetime

from lantern.observability import metrics
from lantern.store.base import Store
from lantern.store.records import Lease, Orphan

log = logging.getLogger("lantern.recovery")

BATCH = 20


class RecoveryLoop:
    def __init__(
        self,
        store: Store,
        *,
        worker_id: str,
        ttl: float,
        interval: float,
        free_slots: Callable[[], int],
        start: Callable[[str, Lease], None],
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.ttl = ttl
        self.interval = interval
        self._free_slots = free_slots
        self._start = start
        self._slot = asyncio.Event()

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            backlog = False
            try:
                limit = min(BATCH, self._free_slots())
                backlog = limit > 0 and len(await self.sweep()) >= limit
            except Exception as exc:  # the database is away: the next pass tries again
                log.warning("recovery sweep failed: %s", exc)
            if backlog:
                # A full pass: more orphans are likely waiting. Go again at once while slots
                # are free, or as soon as one frees up, rather than after a whole interval.
                await self._next_slot(stopping)
                continue
            with suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.interval)

    def slot_freed(self) -> None:
        """A run this replica drove has ended (the worker calls this)."""
        self._slot.set()

    async def _next_slot(self, stopping: asyncio.Event) -> None:
        deadline = asyncio.get_running_loop().time() + self.interval
        while self._free_slots() <= 0 and not stopping.is_set():
            self._slot.clear()
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            with suppress(TimeoutError):
                await asyncio.wait_for(self._slot.wait(), left)
        await asyncio.sleep(0)  # let the runs just started take their first step

    async def sweep(self) -> list[Orphan]:
        """One pass; returns the orphans found (with the leases won)."""
        metrics.SWEEPS.inc()
        limit = min(BATCH, self._free_slots())
        if limit <= 0:
            return []
        orphans = await self.store.recover_orphans(self.worker_id, self.ttl, limit)
        now = datetime.now(UTC)
        metrics.ORPHANS_FOUND.inc(len(orphans))
        for orphan in orphans:
            if orphan.lease is None:
                continue  # another replica won it
            metrics.LEASES_STOLEN.inc()
            if orphan.expired_at is not None:  # None: a queued run that never had a lease
                metrics.RECOVERY_LATENCY.observe((now - orphan.expired_at).total_seconds())
            log.info(
                "recovering run %s from %s (epoch %s)",
                orphan.run_id,
                orphan.previous_worker or "nobody",
                orphan.lease.epoch,
            )
            self._start(orphan.run_id, orphan.lease)
        return orphans
