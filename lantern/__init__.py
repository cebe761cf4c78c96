"""Lantern: durable execution for AI agents.

Users import the App (their tools and code-first agents), the ToolContext a tool may ask
for, the Context a code-first agent receives (with its ModelReply and Approval), the API
clients (Client, AsyncClient) with their result types, and one tree of errors.
"""

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
    "ToolContext",
    "Unauthorized",
    "Unprocessable",
    "Usage",
    "UsageError",
    "WaitTimeout",
    "__version__",
]
