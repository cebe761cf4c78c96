"""Lantern: durable execution for AI agents.

Users import the App (their tools and code-first agents), the ToolContext a tool may ask
for, the Context a code-first agent receives (with its ModelReply and Approval), the API
clients (Client, AsyncClient) with their result types, and one tree of errors.

Names resolve on first use (PEP 562), so ``import lantern`` and the ``lantern`` command line
pay for no part they do not touch: ``lantern --help`` starts without the SDK's HTTP client or
the App.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lantern.app import App, Approval, Context, ModelReply, ToolContext
    from lantern.errors import (
        Conflict,
        DefinitionError,
        Forbidden,
        LanternError,
        LeaseLost,
        NotFound,
        StepError,
        StoreError,
        Unauthorized,
        UsageError,
    )
    from lantern.sdk import (
        Agent,
        ApiError,
        AsyncClient,
        AuthenticationError,
        BadRequest,
        Client,
        ConflictError,
        ConnectionFailed,
        Event,
        InvalidResponse,
        LiveTexts,
        NotFoundError,
        Page,
        PayloadTooLarge,
        PermissionDenied,
        RateLimited,
        Receipt,
        Run,
        ServerError,
        TextDelta,
        TextReset,
        Unprocessable,
        Usage,
        WaitTimeout,
    )

__version__ = "0.1.0"

# Where each public name lives; `__getattr__` imports that module on first use.
_HOMES = {
    **dict.fromkeys(("App", "Approval", "Context", "ModelReply", "ToolContext"), "lantern.app"),
    **dict.fromkeys(
        (
            "Conflict",
            "DefinitionError",
            "Forbidden",
            "LanternError",
            "LeaseLost",
            "NotFound",
            "StepError",
            "StoreError",
            "Unauthorized",
            "UsageError",
        ),
        "lantern.errors",
    ),
}


__all__ = [
    "Agent",
    "ApiError",
    "App",
    "Approval",
    "AsyncClient",
    "AuthenticationError",
    "BadRequest",
    "Client",
    "Conflict",
    "ConflictError",
    "ConnectionFailed",
    "Context",
    "DefinitionError",
    "Event",
    "Forbidden",
    "InvalidResponse",
    "LanternError",
    "LeaseLost",
    "LiveTexts",
    "ModelReply",
    "NotFound",
    "NotFoundError",
    "Page",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "Receipt",
    "Run",
    "ServerError",
    "StepError",
    "StoreError",
    "TextDelta",
    "TextReset",
    "ToolContext",
    "Unauthorized",
    "Unprocessable",
    "Usage",
    "UsageError",
    "WaitTimeout",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name not in __all__ or name == "__version__":
        raise AttributeError(f"module 'lantern' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES.get(name, "lantern.sdk")), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
