"""Schedules as stored (docs/schedules.md), and the store role that keeps them.

A schedule is its definition (what the API was given, normalised) plus its firing state.
Every replica fires due schedules; the run a fire time starts is made unique by its
idempotency key, and the state moves on with one conditional write on ``next_fire_at``
(``advance_schedule``), so replicas racing on one schedule agree on what happened.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from lantern.store.records import Run

SKIPS_KEPT = 20  # the newest skipped fire times a schedule remembers


@dataclass(frozen=True)
class Skip:
    fire_time: datetime
    reason: str  # "overlap", "catchup", or why the run could not be created


@dataclass(frozen=True)
class Schedule:
    workspace: str
    name: str
    definition: dict[str, Any]
    paused: bool
    next_fire_at: datetime
    created_at: datetime
    updated_at: datetime
    last_fire_at: datetime | None = None
    last_run_id: str | None = None
    buffered_fire_at: datetime | None = None  # overlap buffer_one: the fire that waits
    recent_skips: tuple[Skip, ...] = field(default=())


@dataclass(frozen=True)
class Advance:
    """The state a firing pass leaves: replaces the schedule's firing columns."""

    next_fire_at: datetime
    last_fire_at: datetime | None
    last_run_id: str | None
    buffered_fire_at: datetime | None
    recent_skips: tuple[Skip, ...]


class ScheduleStore(Protocol):
    async def put_schedule(
        self,
        workspace: str,
        name: str,
        definition: dict[str, Any],
        paused: bool,
        next_fire_at: datetime,
    ) -> Schedule:
        """Create or replace the definition (keeping the firing history); a replaced one
        drops its buffered fire."""

    async def get_schedule(self, workspace: str, name: str) -> Schedule | None: ...

    async def list_schedules(self, workspace: str) -> list[Schedule]:
        """The workspace's schedules by name."""

    async def delete_schedule(self, workspace: str, name: str) -> bool: ...

    async def due_schedules(self, now: datetime, limit: int) -> list[Schedule]:
        """Unpaused schedules (of every workspace) due at ``now`` or holding a buffered
        fire, the most overdue first."""

    async def next_fire(self) -> datetime | None:
        """The earliest ``next_fire_at`` of the unpaused schedules."""

    async def advance_schedule(self, schedule: Schedule, advance: Advance) -> bool:
        """Write ``advance`` only if the schedule's ``next_fire_at`` and buffered fire are
        still those of ``schedule`` (as read); False when another replica moved it first."""

    async def record_fire(
        self, workspace: str, name: str, fire_time: datetime, run_id: str
    ) -> None:
        """A fire outside the schedule's own times (trigger now): the last fire and run."""

    async def schedule_runs(
        self,
        workspace: str,
        name: str,
        *,
        status: str | None = None,
        agent_name: str | None = None,
        limit: int = 50,
        before: str | None = None,
    ) -> list[Run]:
        """The runs the schedule's fires created, newest first (of ``status`` and
        ``agent_name`` where given)."""

    async def run_key(self, run_id: str) -> str | None:
        """The idempotency key the run was created under."""


def skips_to_json(skips: tuple[Skip, ...]) -> list[dict[str, str]]:
    return [{"fireTime": s.fire_time.isoformat(), "reason": s.reason} for s in skips]


def skips_from_json(items: list[dict[str, str]]) -> tuple[Skip, ...]:
    return tuple(Skip(datetime.fromisoformat(i["fireTime"]), i["reason"]) for i in items)


SCHEDULE_KEYS = "schedule|"  # the idempotency keys of runs schedules start: theirs alone


def key_prefix(name: str) -> str:
    """Every run a schedule's fires create has an idempotency key starting with this."""
    return f"{SCHEDULE_KEYS}{name}|"


def schedule_runs_query(
    columns: str,
    mark: str,
    workspace: str,
    name: str,
    status: str | None,
    agent_name: str | None,
    limit: int,
    before: str | None,
) -> tuple[str, list[Any]]:
    """``ScheduleStore.schedule_runs`` as one SQL text and its arguments, for a backend whose
    placeholder is ``mark`` (the two differ in nothing else)."""
    prefix = key_prefix(name)
    sql = (
        f"SELECT {columns} FROM runs WHERE workspace = {mark}"
        f" AND substr(idempotency_key, 1, {mark}) = {mark}"
    )
    args: list[Any] = [workspace, len(prefix), prefix]
    for column, value in (("status", status), ("agent_name", agent_name)):
        if value is not None:
            sql += f" AND {column} = {mark}"
            args.append(value)
    if before is not None:
        sql += f" AND id < {mark}"
        args.append(before)
    return sql + f" ORDER BY id DESC LIMIT {mark}", [*args, limit]


def rfc3339(t: datetime) -> str:
    """A fire time as keys and the API write it: UTC, whole seconds unless it has a fraction."""
    t = t.astimezone(UTC)
    spec = "seconds" if t.microsecond == 0 else "milliseconds"
    return t.isoformat(timespec=spec).replace("+00:00", "Z")


def schedule_json(s: Schedule) -> dict[str, Any]:
    """A schedule as the API gives it (docs/schedules.md)."""
    return {
        "name": s.name,
        **s.definition,
        "paused": s.paused,
        "nextFireAt": None if s.paused else rfc3339(s.next_fire_at),
        "lastFireAt": None if s.last_fire_at is None else rfc3339(s.last_fire_at),
        "lastRunId": s.last_run_id,
        "recentSkips": [
            {"fireTime": rfc3339(k.fire_time), "reason": k.reason} for k in s.recent_skips
        ],
        "createdAt": s.created_at.isoformat(),
        "updatedAt": s.updated_at.isoformat(),
    }
