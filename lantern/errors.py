"""Lantern's one error tree.

    LanternError
    ├── UsageError                 bad input from a caller: nothing was changed
    │   ├── DefinitionError        an agent definition with one or more problems
    │   └── TooLarge               past a size limit (413)
    ├── NotFound                   an unknown run or agent
    ├── Conflict                   the request contradicts what is stored (a reused key, ...)
    ├── Unauthorized               no API key, or an unknown or revoked one
    ├── Forbidden                  the key lacks the scope, or the object is another workspace's
    ├── StoreError                 the database refused or failed
    │   ├── LeaseLost              a fenced write by a writer whose lease is gone
    │   └── StoreUnavailable       the database cannot be reached or cannot write now
    └── StepError                  a step failed; carries its error class and retryability
        ├── TemplateError          a template could not be rendered
        ├── BudgetExceeded         a model call would pass the run's or workspace's budget
        └── Throttled              a model call would pass a rate limit: the step waits

    Crash (BaseException)          test-only: abandons a run as a SIGKILL would

Error classes of a step failure are the retry policy's vocabulary: ``llm``, ``connector``,
``tool``, ``timeout``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

ErrorClass = Literal["llm", "connector", "tool", "timeout"]


class LanternError(Exception):
    """The root of every error Lantern raises on purpose."""


class UsageError(LanternError):
    """The caller asked for something invalid; nothing was changed."""


class DefinitionError(UsageError):
    """An agent definition is invalid. Every problem is listed, each naming its node."""

    def __init__(self, problems: Sequence[str], what: str = "agent definition") -> None:
        self.problems = list(problems)
        super().__init__(f"invalid {what}: " + "; ".join(self.problems))


class TooLarge(UsageError):
    """A request past a size limit (answered 413); nothing was changed."""


class NotFound(LanternError):
    """An unknown run or agent."""


class Conflict(LanternError):
    """The request contradicts what is stored: a reused idempotency key, a decided approval."""


class Unauthorized(LanternError):
    """No API key, or one that is unknown or revoked."""


class Forbidden(LanternError):
    """The key lacks a scope, or the object belongs to another workspace."""


class QueueFull(LanternError):
    """The workspace has its limit of runs queued (LANTERN_MAX_QUEUED_RUNS): the run was not
    stored. Raised by the store's own count; the create decides what it answers."""


class StoreError(LanternError):
    """The database failed or refused a write."""


class LeaseLost(StoreError):
    """A journal write was refused because the writer's lease epoch is no longer current."""

    def __init__(self, run_id: str, epoch: int) -> None:
        self.run_id = run_id
        self.epoch = epoch
        super().__init__(f"run {run_id}: lease epoch {epoch} is no longer current; stopping")


class StoreUnavailable(StoreError):
    """The database could not be reached, or could not write (a lost connection, a restart,
    a full disk). Transient: the same call may succeed once the cause is gone, and a journal
    append may be sent again (its events carry their sequence, so it cannot land twice)."""


class StepError(LanternError):
    """A step failed. ``error_class`` and ``retryable`` drive the retry policy;
    ``retry_after_ms`` (a provider's ``Retry-After``) is the least wait before another attempt."""

    def __init__(
        self,
        message: str,
        *,
        error_class: ErrorClass,
        retryable: bool = False,
        retry_after_ms: int = 0,
    ) -> None:
        self.error_class: ErrorClass = error_class
        self.retryable = retryable
        self.retry_after_ms = retry_after_ms
        super().__init__(message)

    def to_json(self) -> dict[str, object]:
        # The message may quote anything a tool or a peer said: keep it storable.
        message = str(self).replace("\x00", "\\0").encode(errors="replace").decode()
        return {"message": message, "class": self.error_class, "retryable": self.retryable}


class ToolUnavailable(StepError):
    """The tool could not be reached (its MCP server is down, or died or hung mid-call): the
    step fails, class ``tool``, retryable. Unlike a tool's own error it is not the model's to
    handle, so a plain agent's tool call fails its step rather than answering the model."""

    def __init__(self, message: str) -> None:
        super().__init__(message, error_class="tool", retryable=True)


class TemplateError(StepError):
    def __init__(self, message: str) -> None:
        super().__init__(message, error_class="tool", retryable=False)


class BudgetExceeded(StepError):
    """A model call would pass a budget; raised before the provider is contacted. The run
    fails with error code ``budget_exceeded`` (never retried: the spend only grows)."""

    code = "budget_exceeded"

    def __init__(self, message: str) -> None:
        super().__init__(message, error_class="llm", retryable=False)

    def to_json(self) -> dict[str, object]:
        return {**super().to_json(), "code": self.code}


class Throttled(StepError):
    """A model call would pass the rate limit ``limit`` now; it was not made. Not a failed
    attempt: the step waits ``wait_ms`` (journaled ``step_throttled``) and asks again with
    the same attempt and idempotency key."""

    def __init__(self, limit: str, wait_ms: int) -> None:
        super().__init__(
            f"rate limit {limit!r}: the model call waits {wait_ms} ms",
            error_class="llm",
            retryable=True,
        )
        self.limit = limit
        self.wait_ms = wait_ms
