"""THE fenced commit, once: what every writer of the journal calls (``commit``).

Every drive (``Drive.commit``), the microVM tier's relay of a VM's reports and its scheduler
write the journal through ``commit``: one ``Append`` under the writer's lease epoch (it lands
only while that epoch is current, else LeaseLost), its latency in
``lantern_journal_write_seconds``, its events counted by kind, the run's log lines, and the
app's commit listeners. What a drive adds on top (its anomaly detector, its lease keeper, its
final update) stays in ``Drive``.

A commit is sent again, with backoff, when the store answers ``StoreUnavailable``
(a lost connection, a restart, a full disk), for as long as the lease could still be ours:
up to one TTL since the first failure. Sending it again is safe because a commit is fenced
(it lands only while the writer's epoch is current) and its events carry their sequence:
an append whose first answer was lost finds itself already stored and succeeds, and one that
a new holder superseded is refused with LeaseLost. Past the TTL the error is raised and the
run is left to whoever holds its lease next, as after a crash.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lantern.engine.journal import count_committed
from lantern.engine.new_run import NewRun
from lantern.errors import StoreUnavailable
from lantern.observability import logs, metrics
from lantern.store.base import Store
from lantern.store.records import Append, Lease, NewEvent, Run, RunUpdate

# The app's commit listeners (``App.on_commit``): called with the run id and its new events.
Listener = Callable[[str, Sequence[NewEvent]], None]

log = logging.getLogger("lantern.commits")

FIRST_DELAY = 0.05  # seconds before the first retry
MAX_DELAY = 2.0  # the backoff's ceiling


@dataclass
class WriteHealth:
    """Whether this process's journal commits are going through: readiness reads it, so a
    replica whose commits fail (a full disk, the database away) stops being sent work even
    when a small probe write would still pass."""

    failing_since: float | None = None
    cause: str | None = None
    _failing: set[str] = field(default_factory=set)  # runs whose last commit failed

    def failed(self, run_id: str, exc: BaseException) -> None:
        if self.failing_since is None:
            self.failing_since = time.monotonic()
        self.cause = str(exc)
        self._failing.add(run_id)

    def succeeded(self, run_id: str) -> None:
        self._failing.discard(run_id)
        if not self._failing:
            self.failing_since = self.cause = None

    def gave_up(self, run_id: str) -> None:
        self._failing.discard(run_id)
        if not self._failing:
            self.failing_since = None  # the cause stays, for the log and the next probe


async def append(
    store: Store, batch: Append, *, patience: float, health: WriteHealth | None = None
) -> None:
    """``store.append(batch)``, sent again across StoreUnavailable for up to ``patience``
    seconds (the lease TTL) with exponential backoff."""
    deadline: float | None = None
    delay = FIRST_DELAY
    run_id = batch.lease.run_id
    while True:
        try:
            await store.append(batch)
            if health is not None:
                health.succeeded(run_id)
            if deadline is not None:
                log.info("run %s: journal commit went through after retrying", batch.lease.run_id)
            return
        except StoreUnavailable as exc:
            metrics.STORE_UNAVAILABLE.inc()
            if health is not None:
                health.failed(run_id, exc)
            now = time.monotonic()
            if deadline is None:
                deadline = now + patience
            if now + delay > deadline:
                log.error(
                    "run %s: journal commit failed for %.0f s, giving up: %s",
                    run_id,
                    patience,
                    exc,
                )
                if health is not None:
                    health.gave_up(run_id)
                raise
            log.warning(
                "run %s: journal commit failed (%s); sending it again in %.2f s",
                run_id,
                exc,
                delay,
            )
            metrics.COMMIT_RETRIES.inc()
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_DELAY)


async def commit(
    store: Store,
    batch: Append,
    *,
    patience: float,
    health: WriteHealth | None = None,
    listeners: Sequence[Listener] = (),
    run: Run | None = None,
) -> None:
    """Append ``batch`` fenced on its lease (across a database blink for up to ``patience``
    seconds), then account for it (``committed``): durable, or LeaseLost / StoreUnavailable."""
    started = time.perf_counter()
    await append(store, batch, patience=patience, health=health)
    metrics.JOURNAL_WRITE.observe(time.perf_counter() - started)
    committed(batch, listeners, run)


async def start(
    store: Store,
    run_id: str,
    worker_id: str,
    ttl: float,
    events: Sequence[NewEvent],
    update: RunUpdate,
    new: NewRun | None = None,
) -> Lease | None:
    """Lease a never-started run and journal its opening in one transaction (``start_run``),
    timed like every other journal write; None when another worker started it first.
    ``new``: the run is not stored yet, and is stored in that transaction too."""
    started = time.perf_counter()
    if new is not None:
        lease = await new.start(store, worker_id, ttl, events, update)
    else:
        lease = await store.start_run(run_id, worker_id, ttl, events, update)
    if lease is not None:
        metrics.JOURNAL_WRITE.observe(time.perf_counter() - started)
    return lease


def committed(batch: Append, listeners: Sequence[Listener] = (), run: Run | None = None) -> None:
    """What follows every landed commit: its events counted, the run's log lines (when the
    run is known: they name its agent), the commit listeners."""
    events = batch.events
    count_committed(events)
    if run is not None:
        logs.run_events(run.id, run.agent_name, run.agent_version, batch.lease.worker_id, events)
    for listener in listeners:
        listener(batch.lease.run_id, list(events))
