"""JSON in and out of the database, the same way for every backend.

Both backends store what the strictest one accepts: finite numbers only, valid UTF-8 (no
lone surrogates), and no NUL character (PostgreSQL's text and jsonb refuse U+0000).
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

import rfc8785

from lantern import limits

# A \u0000 escape preceded by an even number of backslashes (an odd number escapes it).
_NUL = re.compile(r"(?:^|[^\\])(?:\\\\)*\\u0000")


# Encoders made once: json.dumps with any option builds a new JSONEncoder on every call, a
# measurable part of a small event's cost on the commit path (each step writes a few).
_DUMPS = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
_string = json.encoder.encode_basestring  # a str as those encoders write it (not ASCII-only)


def dumps(value: Any) -> str:
    return _DUMPS(value)


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
    if limits.depth_exceeds(value):
        return limits.too_deep_problem()
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
        canonical_json(value)
    except rfc8785.IntegerDomainError:
        return "it contains an integer beyond ±2^53, which JSON cannot carry exactly"
    except rfc8785.CanonicalizationError as exc:
        return f"it cannot be put in canonical JSON: {exc}"
    return None


_SAFE = 2**53 - 1


def canonical_json(value: Any, *, plain: bool | None = None) -> bytes:
    """RFC 8785 canonical JSON, with JSON's numbers read as doubles (I-JSON).

    Plain values go through the standard library, which writes the same bytes for them at a
    third of the cost (a property test holds the two equal); the rest part by part
    (``_composed``), with ``rfc8785`` writing only the numbers the standard library would not
    write as it does. ``plain``, when the caller knows, spares the walk that decides it.
    """
    if plain if plain is not None else _plain(value):
        return _CANONICAL(value).encode()
    try:
        return _composed(value).encode()
    except UnicodeEncodeError as exc:  # a lone surrogate: refused as the library refuses it
        raise rfc8785.CanonicalizationError("input contains non-UTF-8 codepoints") from exc


def is_plain(value: Any) -> bool:
    """Whether ``canonical_json`` may write ``value`` with the standard library."""
    return _plain(value)


def _plain(value: Any) -> bool:
    """No floats (ES number formatting differs), no integer beyond 2^53, ASCII keys only (so
    code-point order is UTF-16 order): json.dumps then matches RFC 8785 byte for byte."""
    if isinstance(value, str) or value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return -_SAFE <= value <= _SAFE
    if isinstance(value, dict):
        return all(isinstance(k, str) and k.isascii() and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return False


def _composed(value: Any) -> str:
    """RFC 8785 for a value that is not plain: strings, small integers, booleans and null as
    the standard library writes them (as RFC 8785 does), objects in RFC 8785's key order
    (UTF-16 code units), and by ``rfc8785`` only what the standard library writes otherwise
    (most floats, an integer beyond 2^53, a tuple). A model step's output, whose usage has a
    float, is then not written wholly by the library, which is pure Python."""
    if isinstance(value, str):
        return _string(value)
    if value is None or isinstance(value, bool):
        return "null" if value is None else "true" if value else "false"
    if isinstance(value, int) and -_SAFE <= value <= _SAFE:
        return int.__repr__(value)
    if isinstance(value, float) and 1e-4 <= abs(value) < 1e16 and not value.is_integer():
        # Written without an exponent and with a fraction, where Python's shortest repr is
        # ECMAScript's number formatting, which RFC 8785 prescribes.
        return float.__repr__(value)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        ordered = sorted(value.items(), key=lambda item: item[0].encode("utf-16-be"))
        return "{" + ",".join(f"{_string(k)}:{_composed(v)}" for k, v in ordered) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_composed(v) for v in value) + "]"
    return rfc8785.dumps(_as_ijson(value)).decode()


def _as_ijson(value: Any) -> Any:
    """An integer beyond 2^53 written as a double's shortest decimal is that double:
    PostgreSQL's jsonb gives 5.799163883669751e16 back as 57991638836697510, and both must
    canonicalise alike. Any other integer beyond 2^53 stays, and canonical JSON refuses it."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and not -_SAFE <= value <= _SAFE:
        as_float = float(value)
        # A double's shortest decimal, which jsonb writes, is what its integer digits must be.
        return as_float if Decimal(repr(as_float)) == value else value
    if isinstance(value, dict):
        return {k: _as_ijson(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_ijson(v) for v in value]
    return value
