"""Go durations, and the settings that fall back to their defaults on a bad one."""

from __future__ import annotations

import logging

import pytest

from lantern.config import Settings
from lantern.durations import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("30s", 30.0),
        ("1m30s", 90.0),
        ("1h2m3.5s", 3723.5),
        ("1.5h", 5400.0),
        ("300us", 0.0003),
        ("2µs", 2e-6),  # micro sign U+00B5
        ("2μs", 2e-6),  # Greek mu U+03BC
        ("7ns", 7e-9),
        ("-1s", -1.0),
        ("-1.5h", -5400.0),
        ("+5s", 5.0),
        ("0", 0.0),
        ("-0", 0.0),
        ("0s", 0.0),
        (".5s", 0.5),
        ("1.s", 1.0),
        ("10m", 600.0),
        ("1h1h", 7200.0),
        ("2m0.5s100ms", 120.6),
    ],
)
def test_go_durations_parse_to_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    "text",
    ["", "10", "1x", "1.2.3s", "s", "-", "+", "--1s", "1h-1m", "1 s", "1S", "ms", ".s", "1sm"],
)
def test_invalid_durations_raise_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_the_error_quotes_the_text() -> None:
    with pytest.raises(ValueError, match=r"'1\.2\.3s'"):
        parse_duration("1.2.3s")


# ---------------------------------------------------------------- settings


def test_settings_defaults() -> None:
    s = Settings.from_env({})
    assert s.lease_ttl == 60.0 and s.step_timeout == 600.0
    assert s.recovery_interval == 30.0


def test_settings_read_valid_durations(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="lantern.config"):
        s = Settings.from_env({"LANTERN_LEASE_TTL": "1m30s", "LANTERN_RECOVERY_INTERVAL": "250ms"})
    assert s.lease_ttl == 90.0
    assert s.recovery_interval == 0.25
    assert not caplog.records


@pytest.mark.parametrize("bad", ["soon", "10", "0", "0s", "-5s", ""])
def test_a_bad_recovery_interval_falls_back_to_30s_with_a_warning(
    bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="lantern.config"):
        s = Settings.from_env({"LANTERN_RECOVERY_INTERVAL": bad, "LANTERN_LEASE_TTL": "2m"})
    assert s.recovery_interval == 30.0
    assert s.lease_ttl == 120.0  # the valid one is kept
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.name == "lantern.config"
    message = record.getMessage()
    assert "LANTERN_RECOVERY_INTERVAL" in message
    assert repr(bad) in message
    assert "30s" in message


@pytest.mark.parametrize("bad", ["forever", "1x", "0", "-10m"])
def test_a_bad_lease_ttl_falls_back_to_60s_with_a_warning(
    bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="lantern.config"):
        s = Settings.from_env({"LANTERN_LEASE_TTL": bad})
    assert s.lease_ttl == 60.0
    assert s.recovery_interval == 30.0
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "LANTERN_LEASE_TTL" in message
    assert repr(bad) in message
    assert "60s" in message


def test_both_bad_give_two_warnings(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="lantern.config"):
        s = Settings.from_env({"LANTERN_LEASE_TTL": "x", "LANTERN_RECOVERY_INTERVAL": "-1s"})
    assert (s.lease_ttl, s.recovery_interval) == (60.0, 30.0)
    names = sorted(
        "LANTERN_LEASE_TTL" if "LANTERN_LEASE_TTL" in r.getMessage() else "RECOVERY"
        for r in caplog.records
    )
    assert names == ["LANTERN_LEASE_TTL", "RECOVERY"]
