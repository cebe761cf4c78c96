"""How a client of the API writes a request's path and query and reads an answer's JSON: one
way for the SDK's ``AsyncClient`` (httpx) and the command line's ``Api`` (``http.client``).
No HTTP library is imported here, so the command line pays for none it does not use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import quote

from lantern.sdk.errors import InvalidResponse

T = TypeVar("T")


def parsed(parse: Callable[[Any], T], data: Any) -> T:
    """A typed result from an answer's JSON; ``InvalidResponse`` if it is not the API's shape."""
    try:
        return parse(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidResponse(f"unexpected answer from the server: {exc!r}") from exc


def seg(value: str) -> str:
    """One path segment, percent-encoded."""
    return quote(str(value), safe="")


def param(value: Any) -> str:
    """A query parameter's value as the API reads it: ``true``/``false``, seconds as
    ``seconds`` writes them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return seconds(value)
    return str(value)


def seconds(value: float) -> str:
    """A number of seconds as the query wants it: ``30``, ``0.5``."""
    return f"{max(value, 0.0):g}"
