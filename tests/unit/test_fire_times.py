"""A cron in a time zone across DST changes (docs/schedules.md), computed, not waited for:
a wall time the zone skips does not fire, one it repeats fires once."""

from __future__ import annotations

from datetime import UTC, datetime

from lantern.engine.fire_times import Timing

PARIS = "Europe/Paris"


def fires(timing: Timing, start: datetime, count: int) -> list[str]:
    found, t = [], start
    for _ in range(count):
        t = timing.after(t)
        found.append(t.astimezone(timing.zone).isoformat())
    return found


def test_a_wall_time_skipped_in_spring_does_not_fire() -> None:
    # 29 March 2026: Paris goes from 02:00 to 03:00, so there is no 02:30 that day.
    daily = Timing(cron="30 2 * * *", timezone=PARIS)
    assert fires(daily, datetime(2026, 3, 27, 12, tzinfo=UTC), 3) == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]


def test_a_wall_time_repeated_in_autumn_fires_once() -> None:
    # 25 October 2026: Paris goes from 03:00 back to 02:00, so 02:00-02:59 happen twice.
    every_20 = Timing(cron="*/20 2-3 * * *", timezone=PARIS)
    assert fires(every_20, datetime(2026, 10, 24, 23, 50, tzinfo=UTC), 6) == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:20:00+02:00",
        "2026-10-25T02:40:00+02:00",
        "2026-10-25T03:00:00+01:00",
        "2026-10-25T03:20:00+01:00",
        "2026-10-25T03:40:00+01:00",
    ]
    # Looking back over the night gives the same times (what a catch-up starts).
    night = every_20.between(
        datetime(2026, 10, 24, 23, 0, tzinfo=UTC), datetime(2026, 10, 25, 2, 50, tzinfo=UTC), 100
    )
    assert [t.astimezone(every_20.zone).isoformat() for t in night] == fires(
        every_20, datetime(2026, 10, 24, 23, 50, tzinfo=UTC), 6
    )


def test_the_daily_time_keeps_its_wall_clock_across_the_change() -> None:
    nightly = Timing(cron="0 6 * * *", timezone=PARIS)
    got = fires(nightly, datetime(2026, 10, 24, 12, tzinfo=UTC), 2)
    assert got == ["2026-10-25T06:00:00+01:00", "2026-10-26T06:00:00+01:00"]
    assert nightly.after(datetime(2026, 10, 24, 12, tzinfo=UTC)) == datetime(
        2026, 10, 25, 5, 0, tzinfo=UTC
    )


def test_seconds_first_and_every_are_aligned() -> None:
    t = datetime(2026, 1, 1, 0, 0, 0, 300000, tzinfo=UTC)
    assert Timing(cron="*/5 * * * * *").after(t) == datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    assert Timing(every_s=2.0).after(t) == datetime(2026, 1, 1, 0, 0, 2, tzinfo=UTC)
