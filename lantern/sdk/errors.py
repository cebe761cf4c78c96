"""What the Python SDK raises: every error is a ``lantern.LanternError``.

    LanternError
    ├── ApiError                   the server answered with an error (RFC 9457 problem+json)
    │   ├── BadRequest             400 malformed body           (also a lantern.UsageError)
    │   ├── AuthenticationError    401 no or unknown API key     (also a lantern.Unauthorized)
    │   ├── PermissionDenied       403 missing scope or another  (also a lantern.Forbidden)
    │   │                              workspace's object
    │   ├── NotFoundError          404 unknown run or agent      (also a lantern.NotFound)
    │   ├── ConflictError          409 a reused idempotency key, (also a lantern.Conflict)
    │   │                              a finished run, a node not waiting
    │   ├── PayloadTooLarge        413 body too large            (also a lantern.UsageError)
    │   ├── Unprocessable          422 invalid definition/input  (also a lantern.UsageError)
    │   ├── RateLimited            429 (raised once retries are spent)
    │   └── ServerError            5xx (raised once retries are spent, for the calls retried)
    ├── ConnectionFailed           no answer: a transport error, after every retry
    ├── InvalidResponse            an answer that is not the API's shape (wrong URL? a proxy?)
    └── WaitTimeout                ``wait()`` gave up before the run finished (also a TimeoutError)

Each ``ApiError`` subclass with an embedded twin (``lantern.errors``) also derives from it, so
``except lantern.NotFound`` reads the same whether Lantern runs in-process or behind the API.
An ``ApiError`` carries the problem: ``status``, ``title``, ``detail``, ``type`` and the whole
``problem`` dict. A body that is not problem JSON still maps by status, its text as the detail.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from lantern.errors import Conflict, Forbidden, LanternError, NotFound, Unauthorized, UsageError

if TYPE_CHECKING:
    from lantern.sdk.models import Run


class ApiError(LanternError):
    """The server answered with an error status; the problem document says why."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        self.type: str = _text(problem.get("type")) or "about:blank"
        self.title: str = _text(problem.get("title")) or _phrase(status)
        self.detail: str = _text(problem.get("detail"))
        message = f"{status} {self.title}"
        super().__init__(f"{message}: {self.detail}" if self.detail else message)


class BadRequest(ApiError, UsageError):
    """400: the request body was malformed; nothing was changed."""


class AuthenticationError(ApiError, Unauthorized):
    """401: no API key, or one the server does not know."""


class PermissionDenied(ApiError, Forbidden):
    """403: the key lacks the scope, or the object belongs to another workspace."""


class NotFoundError(ApiError, NotFound):
    """404: an unknown run or agent. Also a ``lantern.NotFound``, as in embedded use."""


class ConflictError(ApiError, Conflict):
    """409: an idempotency key reused with a different body, a finished run, a node not waiting."""


class PayloadTooLarge(ApiError, UsageError):
    """413: the request body is larger than the server accepts."""


class Unprocessable(ApiError, UsageError):
    """422: an invalid agent definition or input; ``errors`` lists every problem."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(status, problem)
        found = problem.get("errors")
        self.errors: list[str] = [_text(e) for e in found] if isinstance(found, list) else []


class RateLimited(ApiError):
    """429: too many requests, still refused after every retry."""


class ServerError(ApiError):
    """5xx: the server failed."""


class ConnectionFailed(LanternError, ConnectionError):
    """The server could not be reached (or the connection broke), after every retry."""


class InvalidResponse(LanternError):
    """The server answered, but not in the API's shape."""


class WaitTimeout(LanternError, TimeoutError):
    """``wait()`` timed out; ``run`` is the run as last seen, still unfinished."""

    def __init__(self, run: Run, timeout: float) -> None:
        self.run = run
        self.timeout = timeout
        super().__init__(f"run {run.id} is still {run.status} after {timeout:g}s")


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: AuthenticationError,
    403: PermissionDenied,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLarge,
    422: Unprocessable,
    429: RateLimited,
}


def error_for(status: int, problem: dict[str, Any]) -> ApiError:
    """The exception for an error status and its problem document."""
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
    return cls(status, problem)


def error_from_body(status: int, body: str) -> ApiError:
    """The exception for an error answer whose body may or may not be problem JSON."""
    try:
        parsed = json.loads(body) if body.strip() else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return error_for(status, parsed)
    return error_for(status, {"title": _phrase(status), "status": status, "detail": body.strip()})


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _text(value: Any) -> str:
    """A problem member as text: a string as is, anything else (a list of issues...) as JSON."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, default=str)
