"""Keeping leases alive: the holder renews each one every TTL/3.

A renewal that finds its epoch gone marks the run lost, and the runner stops before its next
step; the fenced write would refuse it anyway. A renewal that cannot reach the database is
retried on the next tick while the lease still has time.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress

from lantern.store.base import Store
from lantern.store.records import Lease

log = logging.getLogger("lantern.leases")


class LeaseKeeper:
    def __init__(self, store: Store, ttl: float) -> None:
        self.store = store
        self.ttl = ttl
        self._held: dict[str, Lease] = {}
        self._lost: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def hold(self, lease: Lease) -> None:
        self._held[lease.run_id] = lease
        self._lost.discard(lease.run_id)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._renew_forever(), name="lantern-lease-keeper")

    def drop(self, lease: Lease) -> None:
        if self._held.get(lease.run_id) == lease:
            del self._held[lease.run_id]

    def lost(self, run_id: str) -> bool:
        return run_id in self._lost

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
                if not ok:
                    log.warning("run %s: lease epoch %s was taken over", lease.run_id, lease.epoch)
                    self._lost.add(lease.run_id)
                    self.drop(lease)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
