"""Keeping leases alive: the holder renews each one every TTL/3.

A renewal that finds its epoch gone marks the run lost, and the runner stops before its next
step; the fenced write would refuse it anyway. A renewal that cannot reach the database is
retried on the next tick while the lease still has time. The keeper also watches its runs
for cancellation requests, so a run is stopped by the replica that executes it.

A drive tells the keeper (``releasing``) before it sends a commit that gives its lease up (a
park, the run's end): a renewal pass that read the lease before, and reached the database
after that commit landed, finds the lease given up and may answer before the drive is back
from its commit to ``drop`` it. That is the drive's own release, not a take-over: the lease
is renewed no more, and nothing is logged or marked lost. Were it taken over meanwhile, the
commit itself is refused (LeaseLost) and the drive says so.

Both loops live as long as the keeper (the worker), idle or not. They used to end when they
found nothing held, each on its own clock (the cancel watch within half a second, the renewal
after up to TTL/3), and a run held next found one of them still alive, so the dead one was
never started again: cancels were ignored, or a lease went unrenewed and was stolen. A loop
that dies of an unexpected error is started again by the next ``hold()``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from contextlib import suppress
from typing import Any

from lantern.store.base import Store
from lantern.store.records import Lease

log = logging.getLogger("lantern.leases")

CANCEL_POLL = 0.5  # seconds between looks for cancellation requests
RENEW_BATCH = 1000  # leases renewed per statement


class LeaseKeeper:
    def __init__(self, store: Store, ttl: float, *, cancel_poll: float = CANCEL_POLL) -> None:
        self.store = store
        self.ttl = ttl
        self.cancel_poll = cancel_poll
        self._held: dict[str, Lease] = {}
        self._on_cancel: dict[str, Callable[[], None]] = {}
        self._lost: set[str] = set()
        self._releasing: set[str] = set()  # a commit that gives the lease up is in flight
        self._renewed: dict[str, float] = {}  # run_id -> monotonic time of the last renewal
        self._renewing: dict[str, asyncio.Future[None]] = {}  # run_id -> its renewal in flight
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    def start(self) -> None:
        """Start the renewal and cancel-watch loops, or whichever of them is not running."""
        if self._closed:
            return
        loops: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
            "lantern-lease-renewal": self._renew_forever,
            "lantern-cancel-watch": self._watch_cancels,
        }
        for name, loop in loops.items():
            task = self._tasks.get(name)
            if task is None or task.done():
                if task is not None and not task.cancelled() and task.exception() is not None:
                    log.error("%s had died (%r); started again", name, task.exception())
                self._tasks[name] = asyncio.create_task(loop(), name=name)

    def hold(self, lease: Lease, on_cancel: Callable[[], None] | None = None) -> None:
        self._held[lease.run_id] = lease
        self._lost.discard(lease.run_id)
        self._releasing.discard(lease.run_id)
        self._renewed[lease.run_id] = time.monotonic()
        if on_cancel is not None:
            self._on_cancel[lease.run_id] = on_cancel
        self.start()

    def drop(self, lease: Lease) -> None:
        if self._held.get(lease.run_id) == lease:
            del self._held[lease.run_id]
            self._on_cancel.pop(lease.run_id, None)
            self._renewed.pop(lease.run_id, None)
            self._releasing.discard(lease.run_id)

    def releasing(self, lease: Lease) -> None:
        """A commit that gives ``lease`` up is about to be sent: a renewal that finds the lease
        gone from now on found that commit's doing (were it another holder's, the commit is
        refused and its drive says so)."""
        if self._held.get(lease.run_id) == lease:
            self._releasing.add(lease.run_id)

    async def let_go(self, lease: Lease) -> None:
        """Renew ``lease`` no more, and wait out a renewal of it in flight: one that reached
        the database after the caller released the lease would hold the run for a whole TTL
        more, with nobody executing it."""
        self.drop(lease)
        renewing = self._renewing.get(lease.run_id)
        if renewing is not None:
            await asyncio.shield(renewing)

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
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                await self._renew_all()
            except Exception:  # a bug, not the database: log it and keep renewing
                log.exception("lease renewal pass failed")

    async def _renew_all(self) -> None:
        """Every held lease in one statement: thousands of runs cost one round trip a tick."""
        leases = list(self._held.values())
        for start in range(0, len(leases), RENEW_BATCH):
            # Not those dropped while the batches before were renewed: they may be released.
            batch = [
                x for x in leases[start : start + RENEW_BATCH] if self._held.get(x.run_id) == x
            ]
            if not batch:
                continue
            sent = time.monotonic()  # the new expiry counts from about when the request left
            renewing = asyncio.get_running_loop().create_future()
            for lease in batch:
                self._renewing[lease.run_id] = renewing
            try:
                renewed = await self.store.renew_leases(batch, self.ttl)
            except Exception as exc:  # the database is away: try again next tick
                log.warning("could not renew %d lease(s): %s", len(batch), exc)
                continue
            finally:
                for lease in batch:
                    if self._renewing.get(lease.run_id) is renewing:
                        del self._renewing[lease.run_id]
                renewing.set_result(None)
            for lease in batch:
                if lease.run_id in renewed:
                    if self._held.get(lease.run_id) == lease:
                        self._renewed[lease.run_id] = sent
                    continue
                if self._held.get(lease.run_id) != lease:
                    continue  # dropped meanwhile by its drive
                if lease.run_id in self._releasing:
                    self.drop(lease)  # its drive's commit gave it up; its drop is on the way
                    continue
                log.warning("run %s: lease epoch %s was taken over", lease.run_id, lease.epoch)
                self._lost.add(lease.run_id)
                self.drop(lease)

    async def _watch_cancels(self) -> None:
        while True:
            await asyncio.sleep(self.cancel_poll)
            watched = list(self._on_cancel)
            if not watched:
                continue
            try:
                flagged = await self.store.cancel_requested(watched)
            except Exception as exc:
                log.warning("could not look for cancellations: %s", exc)
                continue
            for run_id in flagged:
                callback = self._on_cancel.pop(run_id, None)
                if callback is not None:
                    try:
                        callback()
                    except Exception:
                        log.exception("run %s: the cancel callback failed", run_id)

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
