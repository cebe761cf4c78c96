"""Schedules fire runs (docs/schedules.md).

Every replica runs a ScheduleLoop beside its recovery sweep: like the sweep, every replica
takes part and the database decides, so losing a replica delays no fire. A pass reads the
due schedules and, for each, creates the run of each fire time under the idempotency key
``schedule|NAME|FIRE_TIME`` (a fire time makes one run however many replicas create it, and
a replica that crashed after creating it leaves the next one to find it), then moves the
schedule on with one write conditional on the ``next_fire_at`` it read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lantern.app import App
from lantern.engine.runs import create_run
from lantern.engine.schedule_spec import ScheduleSpec, check_name, parse_spec, stored_spec
from lantern.errors import Conflict, LanternError, NotFound
from lantern.store.base import Store
from lantern.store.records import Run
from lantern.store.schedules import (
    SCHEDULE_KEYS,
    SKIPS_KEPT,
    Advance,
    Schedule,
    Skip,
    key_prefix,
    rfc3339,
)

log = logging.getLogger("lantern.schedules")

CATCHUP_MAX = 100  # runs one catch-up starts at most (catchup "all")
POLL = 1.0  # seconds between looks for schedules another replica changed
BATCH = 50


def fire_key(name: str, fire_time: datetime) -> str:
    return key_prefix(name) + rfc3339(fire_time)


def schedule_of_key(key: str | None) -> dict[str, str] | None:
    """``{name, fireTime}`` of a run a schedule created, from its idempotency key."""
    if key is None or not key.startswith(SCHEDULE_KEYS):
        return None
    parts = key.split("|")
    if len(parts) != 3:
        return None
    return {"name": parts[1], "fireTime": parts[2]}


async def apply_schedule(
    store: Store, workspace: str, name: str, body: Any, *, app: App | None = None
) -> Schedule:
    """Validate and store a definition. One whose timing is unchanged keeps its next fire
    time (so unpausing catches up by its ``catchup``); a new timing starts from now."""
    check_name(name)
    now = datetime.now(UTC)
    spec = parse_spec(body, now)
    code = app is not None and app.agent_for(workspace, spec.agent_name) is not None
    if not code and await store.get_agent(workspace, spec.agent_name) is None:
        raise NotFound(f"agent {spec.agent_name!r} not found")
    old = await store.get_schedule(workspace, name)
    next_fire = spec.timing.after(now)
    if old is not None:
        before = stored_spec(old.definition, old.paused, now)
        if before.timing == spec.timing:
            next_fire = old.next_fire_at
    return await store.put_schedule(workspace, name, spec.definition(), spec.paused, next_fire)


async def set_paused(store: Store, workspace: str, name: str, paused: bool) -> Schedule:
    old = await _existing(store, workspace, name)
    return await store.put_schedule(workspace, name, old.definition, paused, old.next_fire_at)


async def trigger(store: Store, workspace: str, name: str, app: App | None = None) -> Run:
    """Start a run now, whatever the overlap policy; its fire time is now."""
    s = await _existing(store, workspace, name)
    now = datetime.now(UTC).replace(microsecond=datetime.now(UTC).microsecond // 1000 * 1000)
    d = s.definition
    run = await create_run(
        store,
        d["agentName"],
        d.get("input"),
        workspace,
        idempotency_key=fire_key(name, now),
        app=app,
    )
    await store.record_fire(workspace, name, now, run.id)
    return run


async def _existing(store: Store, workspace: str, name: str) -> Schedule:
    check_name(name)
    s = await store.get_schedule(workspace, name)
    if s is None:
        raise NotFound(f"schedule {name!r} not found")
    return s


@dataclass
class _Pass:
    """What one schedule's pass decides, applied as one Advance."""

    last_fire_at: datetime | None
    last_run_id: str | None
    buffered: datetime | None
    skips: list[Skip]
    started: list[Run]


async def fire(
    store: Store, s: Schedule, now: datetime, grace: float, app: App | None = None
) -> list[Run]:
    """One schedule's due fires at ``now``; the runs started (or found started)."""
    spec = stored_spec(s.definition, s.paused, now)
    p = _Pass(s.last_fire_at, s.last_run_id, s.buffered_fire_at, [], [])
    if p.buffered is not None and await _previous_ended(store, p):
        when, p.buffered = p.buffered, None
        await _start(store, s, spec, when, p, app)
    next_fire = s.next_fire_at
    if s.next_fire_at <= now:
        due = spec.timing.between(s.next_fire_at, now, CATCHUP_MAX)
        for when in due:
            chosen = _catchup(spec, due, when, now, grace)
            if not chosen:
                p.skips.append(Skip(when, "catchup"))
            elif spec.overlap == "allow" or await _previous_ended(store, p):
                await _start(store, s, spec, when, p, app)
            elif spec.overlap == "buffer_one" and p.buffered is None:
                p.buffered = when
            else:
                p.skips.append(Skip(when, "overlap"))
        next_fire = spec.timing.after(now)
    skips = (*s.recent_skips, *p.skips)[-SKIPS_KEPT:]
    advance = Advance(next_fire, p.last_fire_at, p.last_run_id, p.buffered, skips)
    if not await store.advance_schedule(s, advance):
        log.debug("schedule %s moved on by another replica", s.name)
    return p.started


def _catchup(
    spec: ScheduleSpec, due: list[datetime], when: datetime, now: datetime, grace: float
) -> bool:
    """Whether a due fire time starts a run. A time no later than ``grace`` (the recovery
    interval: how late a fire may be when a replica dies) is on time; older ones were
    missed while every replica was down, and ``catchup`` decides."""
    if spec.catchup == "all":
        return True
    if spec.catchup == "latest":
        return when == due[-1]
    return (now - when).total_seconds() <= grace


async def _previous_ended(store: Store, p: _Pass) -> bool:
    if p.last_run_id is None:
        return True
    if any(r.id == p.last_run_id for r in p.started):
        return False
    run = await store.get_run(p.last_run_id)
    return run is None or run.finished


async def _start(
    store: Store, s: Schedule, spec: ScheduleSpec, when: datetime, p: _Pass, app: App | None
) -> None:
    key = fire_key(s.name, when)
    try:
        run = await create_run(
            store, spec.agent_name, spec.input, s.workspace, idempotency_key=key, app=app
        )
    except Conflict:
        # The definition's input changed between two replicas' reads: the run created
        # first under this key is the fire's run.
        found = await store.run_for_key(s.workspace, key)
        if found is None:
            raise
        run = found[0]
    except (LanternError, ValueError) as exc:  # the agent is gone, a quota, bad input...
        log.warning("schedule %s could not start its run for %s: %s", s.name, key, exc)
        p.skips.append(Skip(when, f"error: {str(exc)[:200]}"))
        return
    p.started.append(run)
    p.last_fire_at, p.last_run_id = when, run.id


class ScheduleLoop:
    """Fires due schedules: at each next fire time (read from the store), at least every
    POLL for schedules another replica changed, and at once when ``wake`` is called."""

    def __init__(
        self,
        store: Store,
        *,
        grace: float,
        app: App | None = None,
        on_fired: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.grace = grace
        self.app = app
        self._on_fired = on_fired
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            self._wake.clear()
            wait = POLL
            try:
                await self.fire_due()
                upcoming = await self.store.next_fire()
                if upcoming is not None:
                    wait = min(POLL, (upcoming - datetime.now(UTC)).total_seconds())
            except Exception as exc:  # the database is away: the next pass tries again
                log.warning("schedule pass failed: %s", exc)
            with suppress(TimeoutError):  # a floor: a schedule that keeps failing never spins
                await asyncio.wait_for(self._wake.wait(), max(wait, 0.005))

    async def fire_due(self, now: datetime | None = None) -> list[Run]:
        now = now or datetime.now(UTC)
        started: list[Run] = []
        for s in await self.store.due_schedules(now, BATCH):
            try:
                started += await fire(self.store, s, now, self.grace, self.app)
            except Exception as exc:
                log.warning("schedule %s could not fire: %s", s.name, exc)
        if started and self._on_fired is not None:
            self._on_fired()
        return started
