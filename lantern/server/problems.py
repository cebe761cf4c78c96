"""Every error answer is application/problem+json (RFC 9457), mapped here and only here."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response
from starlette.routing import Match

from lantern.errors import (
    Conflict,
    DefinitionError,
    Forbidden,
    LanternError,
    NotFound,
    TooLarge,
    Unauthorized,
    UsageError,
)
from lantern.server.ratelimit import RateLimited

log = logging.getLogger("lantern.server")

MEDIA_TYPE = "application/problem+json"
_STATUS: list[tuple[type[LanternError], int]] = [
    (DefinitionError, 422),
    (TooLarge, 413),
    (UsageError, 422),
    (Unauthorized, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (Conflict, 409),
]


class ProblemResponse(JSONResponse):
    media_type = MEDIA_TYPE


def problem(status: int, detail: str, **extra: Any) -> ProblemResponse:
    title = HTTPStatus(status).phrase
    body = {
        "type": f"https://lantern.dev/problems/{title.lower().replace(' ', '-')}",
        "title": title,
        "status": status,
        "detail": detail,
        **extra,
    }
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return ProblemResponse(body, status_code=status, headers=headers)


def _lantern_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LanternError)
    if isinstance(exc, RateLimited):
        limited = problem(429, str(exc))
        limited.headers["Retry-After"] = str(exc.retry_after)
        return limited
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            if isinstance(exc, DefinitionError):
                return problem(status, str(exc), errors=exc.problems)
            return problem(status, str(exc))
    log.error("request %s %s failed: %s", request.method, request.url.path, exc)
    return problem(500, "the server could not complete the request")


def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    response = problem(exc.status_code, str(exc.detail))
    if exc.headers:
        response.headers.update(exc.headers)
    if exc.status_code == 405:
        # Starlette names only the first matching route's methods; a path may have several.
        response.headers["Allow"] = ", ".join(sorted(_methods(request.app.routes, request.scope)))
    return response


def _methods(routes: Any, scope: Any) -> set[str]:
    """The methods of every route whose path matches, included routers searched too."""
    allowed: set[str] = set()
    for route in routes:
        match, _ = route.matches(scope)
        if match == Match.NONE:
            continue
        allowed |= set(getattr(route, "methods", None) or ())
        inner = getattr(route, "routes", None) or getattr(
            getattr(route, "original_router", None), "routes", None
        )
        if inner:
            allowed |= _methods(inner, scope)
    return allowed


def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return problem(400, "the request body is not valid JSON")
    described = [
        f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors
    ]
    return problem(422, "; ".join(described), errors=described)


def _unexpected(request: Request, exc: Exception) -> Response:
    # The detail stays generic: an exception's text may carry a secret or a driver's message.
    # (The Guard around the app logs it with its traceback.)
    return problem(500, "the server could not complete the request")


def install(app: FastAPI) -> None:
    app.add_exception_handler(LanternError, _lantern_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected)
