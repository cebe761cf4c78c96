"""Go duration strings (``time.ParseDuration``): ``300ms``, ``1h2m3.5s``, ``-1.5h``, ``2us``."""

from __future__ import annotations

import re

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Parse a Go duration into seconds; raise ValueError on anything Go would refuse.

    The one leniency: surrounding whitespace (a trailing newline in an env file) is ignored.
    """
    s = text.strip()
    sign = 1.0
    if s[:1] in "+-" and s:
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise ValueError(f"invalid duration {text!r}")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return sign * total


def format_duration(seconds: float) -> str:
    """Seconds as Go writes a duration: ``720h0m0s``, ``1m30s``, ``2.5s``, ``250ms``."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms" if seconds > 0 else "0s"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.9g}s"
    if hours:
        return f"{int(hours)}h{int(minutes)}m{text}"
    return f"{int(minutes)}m{text}" if minutes else text
