"""The Python SDK: ``AsyncClient`` (the implementation), ``Client`` (its blocking wrapper),
typed results and the errors they raise."""

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
