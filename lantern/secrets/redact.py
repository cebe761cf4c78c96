"""Scrubbing secret values out of what a step leaves behind: its output, its error, log lines
and spans. A value is replaced by ``[secret NAME]`` in its plain form and in the forms it takes
when quoted into a URL or a JSON string, so an error that quotes a URL or a body hides it too.

A step's output and error are scrubbed of the run's own workspace's secrets only (scrubbing with
another workspace's would tell a tenant that a guess was someone's secret). Log lines are the
operator's, and are scrubbed of every secret this process has substituted.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, quote_plus

MIN_LENGTH = 4  # shorter values would scrub ordinary text; refused when set


def forms(value: str) -> set[str]:
    """The spellings of ``value`` that may appear in a message."""
    found = {value, quote(value, safe=""), quote(value), quote_plus(value)}
    found.add(json.dumps(value)[1:-1])
    found.add(json.dumps(value, ensure_ascii=False)[1:-1])
    return {f for f in found if len(f) >= MIN_LENGTH}


class Redactor:
    """Replaces each of ``secrets`` (name -> value) by ``[secret NAME]``."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        pairs = [(form, f"[secret {name}]") for name, v in secrets.items() for form in forms(v)]
        # Longest first: a value that contains another is replaced whole.
        self._pairs = sorted(pairs, key=lambda p: -len(p[0]))

    def __bool__(self) -> bool:
        return bool(self._pairs)

    def text(self, text: str) -> str:
        for form, shown in self._pairs:
            if form in text:
                text = text.replace(form, shown)
        return text

    def value(self, value: Any) -> Any:
        """A copy of a JSON-like value with every string (keys too) scrubbed; iterative
        enough for any depth the limits allow."""
        if not self._pairs:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(str(k)): self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value

    def exception(self, exc: BaseException) -> BaseException:
        """Scrub ``exc`` in place (its message, and nothing it was raised from: the cause of
        a connector error quotes the URL with the value in it)."""
        if self._pairs:
            exc.args = tuple(self.text(a) if isinstance(a, str) else a for a in exc.args)
            exc.__cause__ = None
            exc.__context__ = None
            exc.__suppress_context__ = True
        return exc


# -- log lines --------------------------------------------------------------------------

_seen: dict[str, str] = {}
_lock = threading.Lock()
_process = Redactor({})


def remember(secrets: Mapping[str, str]) -> None:
    """Values substituted in this process: the log filter scrubs them from every line."""
    global _process
    with _lock:
        fresh = {f"{n}": v for n, v in secrets.items() if _seen.get(v) is None}
        if not fresh:
            return
        for name, value in fresh.items():
            _seen[value] = name
        _process = Redactor({name: value for value, name in _seen.items()})


class LogFilter(logging.Filter):
    """Scrubs remembered secret values from a record's message and its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        redactor = _process
        if not redactor:
            return True
        message = record.getMessage()
        scrubbed = redactor.text(message)
        if record.exc_info and record.exc_info[1] is not None:
            formatted = logging.Formatter().formatException(record.exc_info)
            record.exc_text = redactor.text(formatted)
            record.exc_info = None
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        return True


def install_log_filter() -> None:
    """Put the filter on every handler of the root logger (where lantern's lines end up)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, LogFilter) for f in handler.filters):
            handler.addFilter(LogFilter())
