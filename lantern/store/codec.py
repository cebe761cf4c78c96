"""JSON in and out of the database, the same way for every backend.

Both backends store what the strictest one accepts: finite numbers only, valid UTF-8 (no
lone surrogates), and no NUL character (PostgreSQL's text and jsonb refuse U+0000).
"""

from __future__ import annotations

import json
import re
from typing import Any

import rfc8785

# A \u0000 escape preceded by an even number of backslashes (an odd number escapes it).
_NUL = re.compile(r"(?:^|[^\\])(?:\\\\)*\\u0000")


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def loads_or_none(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def text_problem(text: str) -> str | None:
    """Why serialised JSON cannot be stored, or None."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return "it contains a lone surrogate (not valid UTF-8)"
    if _NUL.search(text):
        return "it contains a NUL character (U+0000)"
    return None


def value_problem(value: Any) -> str | None:
    """Why ``value`` cannot be stored as JSON by every backend and hash-chained, or None."""
    try:
        text = dumps(value)
    except ValueError:
        return "it contains a number that is not finite (NaN or infinity)"
    except TypeError as exc:
        return f"it is not JSON: {exc}"
    return text_problem(text) or chain_problem(value)


def chain_problem(value: Any) -> str | None:
    """Why the journal's canonical JSON (RFC 8785, I-JSON numbers) cannot hold ``value``."""
    try:
        rfc8785.dumps(value)
    except rfc8785.IntegerDomainError:
        return "it contains an integer beyond ±2^53, which JSON cannot carry exactly"
    except rfc8785.CanonicalizationError as exc:
        return f"it cannot be put in canonical JSON: {exc}"
    return None
