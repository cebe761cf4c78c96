"""Provider failures as step errors: class ``llm``, retryable as a provider would want.

Rate limits (429), timeouts (408), conflicts (409, e.g. a request with this Idempotency-Key
still in progress), 5xx and lost connections are worth another attempt; any other 4xx (a bad
request, a bad key, an unknown model) fails the same way every time. The provider's own
message is kept, because it is what a user needs to fix the request.
"""

from __future__ import annotations

from lantern.errors import StepError

RETRYABLE_STATUS = frozenset({408, 409, 429})


def retryable_status(status: int) -> bool:
    return status >= 500 or status in RETRYABLE_STATUS


def status_error(provider: str, model: str, status: int, message: str) -> StepError:
    return StepError(
        f"{provider} model {model!r} answered {status}: {message}",
        error_class="llm",
        retryable=retryable_status(status),
    )


def connection_error(provider: str, model: str, message: str) -> StepError:
    return StepError(
        f"{provider} model {model!r}: no answer ({message})", error_class="llm", retryable=True
    )


def bad_answer(provider: str, model: str, message: str) -> StepError:
    return StepError(f"{provider} model {model!r}: {message}", error_class="llm", retryable=True)
