"""A schedule's definition (docs/schedules.md): validated and normalised, every problem at once."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from lantern.durations import parse_duration
from lantern.engine.fire_times import NeverFires, Timing
from lantern.errors import DefinitionError
from lantern.store.codec import value_problem

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
MIN_EVERY_S = 1.0
Overlap = Literal["skip", "buffer_one", "allow"]
Catchup = Literal["none", "latest", "all"]
OVERLAPS = ("skip", "buffer_one", "allow")
CATCHUPS = ("none", "latest", "all")
FIELDS = {"agentName", "input", "cron", "every", "timezone", "overlap", "catchup", "paused"}


@dataclass(frozen=True)
class ScheduleSpec:
    agent_name: str
    input: Any
    timing: Timing
    overlap: Overlap
    catchup: Catchup
    paused: bool
    every: str | None = None  # as given, for reading back

    def definition(self) -> dict[str, Any]:
        """What is stored (and given back): the normalised fields, without ``paused``."""
        d: dict[str, Any] = {"agentName": self.agent_name, "input": self.input}
        if self.timing.cron is not None:
            d["cron"] = self.timing.cron
        else:
            d["every"] = self.every
        d |= {"timezone": self.timing.timezone, "overlap": self.overlap, "catchup": self.catchup}
        return d


def check_name(name: str) -> None:
    if not NAME.match(name):
        raise DefinitionError(
            [f"schedule name {name[:100]!r} must be 1-100 letters, digits, '.', '_' or '-'"],
            "schedule",
        )


def parse_spec(body: Any, now: datetime) -> ScheduleSpec:
    """Validate a definition (raising DefinitionError with every problem)."""
    if not isinstance(body, dict):
        raise DefinitionError(["a schedule is a JSON object"], "schedule")
    problems = [f"unknown field {k!r}" for k in sorted(set(body) - FIELDS, key=str)]
    agent = body.get("agentName")
    if not isinstance(agent, str) or not NAME.match(agent):
        problems.append("agentName must be an agent's name")
    problem = value_problem(body.get("input"))
    if problem is not None:
        problems.append(f"input cannot be stored: {problem}")
    tz = body.get("timezone", "UTC")
    if not isinstance(tz, str) or not _zone(tz):
        problems.append(f"timezone {str(tz)[:64]!r} is not an IANA time zone name")
        tz = "UTC"
    cron, every = body.get("cron"), body.get("every")
    every_s: float | None = None
    if (cron is None) == (every is None):
        problems.append("give exactly one of cron and every")
    elif cron is not None:
        if not isinstance(cron, str) or len(cron.split()) not in (5, 6) or not _valid(cron):
            problems.append(
                f"cron {str(cron)[:100]!r} is not a cron expression"
                " (five fields, or six with seconds first)"
            )
    else:
        try:
            every_s = parse_duration(every) if isinstance(every, str) else None
        except ValueError:
            every_s = None
        if every_s is None or every_s < MIN_EVERY_S:
            problems.append(f"every {str(every)[:64]!r} must be a Go duration of at least 1s")
    overlap = body.get("overlap", "skip")
    if overlap not in OVERLAPS:
        problems.append(f"overlap must be one of {', '.join(OVERLAPS)}")
    catchup = body.get("catchup", "latest")
    if catchup not in CATCHUPS:
        problems.append(f"catchup must be one of {', '.join(CATCHUPS)}")
    paused = body.get("paused", False)
    if not isinstance(paused, bool):
        problems.append("paused must be true or false")
    if problems:
        raise DefinitionError(problems, "schedule")
    timing = Timing(cron=cron, every_s=every_s, timezone=tz)
    try:
        timing.after(now)
    except NeverFires as exc:
        raise DefinitionError([str(exc)], "schedule") from None
    return ScheduleSpec(
        agent_name=cast(str, agent),
        input=body.get("input"),
        timing=timing,
        overlap=cast(Overlap, overlap),
        catchup=cast(Catchup, catchup),
        paused=paused,
        every=every,
    )


def stored_spec(definition: dict[str, Any], paused: bool, now: datetime) -> ScheduleSpec:
    return parse_spec({**definition, "paused": paused}, now)


def _zone(name: str) -> bool:
    if not name or len(name) > 64 or name.startswith(("/", ".")) or ".." in name:
        return False
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return False
    return True


def _valid(cron: str) -> bool:
    try:
        return bool(croniter.is_valid(cron, second_at_beginning=len(cron.split()) == 6))
    except Exception:  # croniter raises more than its own errors on some input
        return False
