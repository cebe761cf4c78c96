"""When a schedule fires: a cron in a time zone, or a fixed interval.

A cron is matched against wall-clock times in its zone (croniter on naive local times), and
each match is placed on the UTC line with zoneinfo: a wall time that does not exist on a DST
day (the hour skipped in spring) is skipped; one that happens twice (the hour repeated in
autumn) fires once, at its first occurrence. An interval fires at the multiples of itself
since the Unix epoch, so every replica computes the same times without coordination.
"""

from __future__ import annotations

import math
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter

MAX_SCAN = 100_000  # cron candidates looked at before giving up (a cron that never fires)
_AROUND = timedelta(hours=3)  # wider than any DST shift


class NeverFires(ValueError):
    pass


@dataclass(frozen=True)
class Timing:
    cron: str | None = None
    every_s: float | None = None
    timezone: str = "UTC"

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def after(self, t: datetime) -> datetime:
        """The first fire time strictly after ``t``."""
        if self.every_s is not None:
            k = math.floor(t.timestamp() / self.every_s) + 1
            return _at(k * self.every_s)
        zone = self.zone
        start = _wall(t, zone) - (_AROUND if _shifts(t, zone) else timedelta(0))
        it = croniter(self._expr, start, second_at_beginning=self._seconds)
        with suppress(CroniterBadDateError):  # croniter's own "never" (30 February)
            for _ in range(MAX_SCAN):
                fire = _placed(it.get_next(datetime), zone)
                if fire is not None and fire > t:
                    return fire
        raise NeverFires(f"cron {self.cron!r} has no fire time after {t.isoformat()}")

    def between(self, since: datetime, until: datetime, limit: int) -> list[datetime]:
        """The newest ``limit`` fire times in [since, until], oldest first."""
        if self.every_s is not None:
            hi = math.floor(until.timestamp() / self.every_s)
            lo = max(math.ceil(since.timestamp() / self.every_s), hi - limit + 1)
            return [_at(k * self.every_s) for k in range(lo, hi + 1)]
        zone = self.zone
        start = _wall(until, zone) + (_AROUND if _shifts(until, zone) else timedelta(0))
        it = croniter(
            self._expr,
            start + timedelta(microseconds=1),
            is_prev=True,
            second_at_beginning=self._seconds,
        )
        found: list[datetime] = []
        with suppress(CroniterBadDateError):
            self._scan_back(it, zone, since, until, limit, found)
        return found[::-1]

    @staticmethod
    def _scan_back(
        it: croniter,
        zone: ZoneInfo,
        since: datetime,
        until: datetime,
        limit: int,
        found: list[datetime],
    ) -> None:
        for _ in range(MAX_SCAN):
            if len(found) >= limit:
                break
            fire = _placed(it.get_prev(datetime), zone)
            if fire is None or fire > until:
                continue
            if fire < since:
                break
            if not found or fire < found[-1]:  # a repeated wall time appears once
                found.append(fire)

    @property
    def _expr(self) -> str:
        assert self.cron is not None
        return self.cron

    @property
    def _seconds(self) -> bool:
        return len(self._expr.split()) == 6


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def _wall(t: datetime, zone: ZoneInfo) -> datetime:
    return t.astimezone(zone).replace(tzinfo=None, fold=0)


def _shifts(t: datetime, zone: ZoneInfo) -> bool:
    """Whether the zone's offset changes within a few hours of ``t`` (a DST day)."""
    return (t - _AROUND).astimezone(zone).utcoffset() != (t + _AROUND).astimezone(zone).utcoffset()


def _placed(wall: datetime, zone: ZoneInfo) -> datetime | None:
    """The wall time's first occurrence in UTC, or None when the zone skips it."""
    local = wall.replace(tzinfo=zone, fold=0)
    instant = local.astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) != wall:
        return None  # in the gap of a spring-forward day
    return instant
