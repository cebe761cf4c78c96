"""Keeping leases alive: the holder renews each one every TTL/3.

A renewal that finds its epoch gone marks the run lost, and the runner stops before its next
step; the fenced write would refuse it anyway. A renewal that cannot reach the database is
retried on the next tick while the lease still has time. The keeper also watches its runs
for cancellation requests, so a run is stopped by the replica that executes it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import suppress

from lantern.store.base import Store
from lantern.store.records import Lease

log = logging.getLogger("lantern.leases")

CANCEL_POLL = 0.5  # seconds between looks for cancellation requests


class LeaseKeeper:
    def __init__(self, store: Store, ttl: float) -> None:
        self.store = store
        self.ttl = ttl
        self._held: dict[str, Lease] = {}
        self._on_cancel: dict[str, Callable[[], None]] = {}
        self._lost: set[str] = set()
        self._renewed: dict[str, float] = {}  # run_id -> monotonic time of the last renewal
        self._tasks: list[asyncio.Task[None]] = []

    def hold(self, lease: Lease, on_cancel: Callable[[], None] | None = None) -> None:
        self._held[lease.run_id] = lease
        self._lost.discard(lease.run_id)
        self._renewed[lease.run_id] = time.monotonic()
        if on_cancel is not None:
            self._on_cancel[lease.run_id] = on_cancel
        if not any(not t.done() for t in self._tasks):
            self._tasks = [
                asyncio.create_task(self._renew_forever(), name="lantern-lease-renewal"),
                asyncio.create_task(self._watch_cancels(), name="lantern-cancel-watch"),
            ]

    def drop(self, lease: Lease) -> None:
        if self._held.get(lease.run_id) == lease:
            del self._held[lease.run_id]
            self._on_cancel.pop(lease.run_id, None)
            self._renewed.pop(lease.run_id, None)

    def lost(self, run_id: str) -> bool:
        return run_id in self._lost

    def live(self, run_id: str) -> bool:
        """Held, and renewed within the TTL: safe to start new steps under it."""
        renewed = self._renewed.get(run_id)
        return renewed is not None and time.monotonic() - renewed < self.ttl

    @property
    def held(self) -> list[Lease]:
        return list(self._held.values())

    async def _renew_forever(self) -> None:
        while self._held:
            await asyncio.sleep(self.ttl / 3)
            for lease in list(self._held.values()):
                try:
                    ok = await self.store.renew_lease(lease, self.ttl)
                except Exception as exc:  # the database is away: try again next tick
                    log.warning("could not renew the lease of run %s: %s", lease.run_id, exc)
                    continue
                if ok:
                    self._renewed[lease.run_id] = time.monotonic()
                else:
                    if lease.run_id in self._held:  # not given up meanwhile by its own drive
                        log.warning(
                            "run %s: lease epoch %s was taken over", lease.run_id, lease.epoch
                        )
                    self._lost.add(lease.run_id)
                    self.drop(lease)

    async def _watch_cancels(self) -> None:
        while self._held:
            await asyncio.sleep(CANCEL_POLL)
            watched = list(self._on_cancel)
            try:
                flagged = await self.store.cancel_requested(watched)
            except Exception as exc:
                log.warning("could not look for cancellations: %s", exc)
                continue
            for run_id in flagged:
                callback = self._on_cancel.pop(run_id, None)
                if callback is not None:
                    callback()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with suppress(asyncio.CancelledError):
                await task
