"""Lantern: durable execution for AI agents.

Users import the App (their tools), the ToolContext a tool may ask for, the API clients
(Client, AsyncClient) with their result types, and one tree of errors.
"""

from lantern.app import App, ToolContext
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
    NotFoundError,
    Page,
    PayloadTooLarge,
    PermissionDenied,
    RateLimited,
    Receipt,
    Run,
    ServerError,
    Unprocessable,
    Usage,
    WaitTimeout,
)

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "ApiError",
    "App",
    "AsyncClient",
    "AuthenticationError",
    "BadRequest",
    "Client",
    "Conflict",
    "ConflictError",
    "ConnectionFailed",
    "DefinitionError",
    "Event",
    "Forbidden",
    "InvalidResponse",
    "LanternError",
    "LeaseLost",
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
    "ToolContext",
    "Unauthorized",
    "Unprocessable",
    "Usage",
    "UsageError",
    "WaitTimeout",
    "__version__",
]
