"""The Python SDK: ``AsyncClient`` (the implementation), ``Client`` (its blocking wrapper),
typed results and the errors they raise.

Names resolve on first use (PEP 562): the command line reads the typed results and the errors
(``lantern.sdk.models``, ``lantern.sdk.errors``) without loading the HTTP client behind
``AsyncClient``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lantern.sdk.client import AsyncClient
    from lantern.sdk.errors import (
        ApiError,
        AuthenticationError,
        BadRequest,
        ConflictError,
        ConnectionFailed,
        InvalidResponse,
        NotFoundError,
        PayloadTooLarge,
        PermissionDenied,
        RateLimited,
        ServerError,
        Unprocessable,
        WaitTimeout,
    )
    from lantern.sdk.models import Agent, Event, Page, Receipt, Run, Usage
    from lantern.sdk.stream import LiveTexts, TextDelta, TextReset
    from lantern.sdk.sync import Client

# Where each public name lives; `__getattr__` imports that module on first use.
_HOMES = {
    "AsyncClient": "lantern.sdk.client",
    "Client": "lantern.sdk.sync",
    **dict.fromkeys(("Agent", "Event", "Page", "Receipt", "Run", "Usage"), "lantern.sdk.models"),
    **dict.fromkeys(("LiveTexts", "TextDelta", "TextReset"), "lantern.sdk.stream"),
}

__all__ = [
    "Agent",
    "ApiError",
    "AsyncClient",
    "AuthenticationError",
    "BadRequest",
    "Client",
    "ConflictError",
    "ConnectionFailed",
    "Event",
    "InvalidResponse",
    "LiveTexts",
    "NotFoundError",
    "Page",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "Receipt",
    "Run",
    "ServerError",
    "TextDelta",
    "TextReset",
    "Unprocessable",
    "Usage",
    "WaitTimeout",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'lantern.sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES.get(name, "lantern.sdk.errors")), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
