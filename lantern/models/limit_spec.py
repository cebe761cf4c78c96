"""A rate limit's definition as ``PUT /v1/limits/{name}`` takes it (docs/rate-limits.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from lantern.errors import DefinitionError

NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
FIELDS = frozenset({"match", "tokensPerMinute", "requestsPerMinute", "scope"})
SCOPES = ("workspace", "server")
MAX_PER_MINUTE = 10**12  # far past any provider's limit, and within a 64-bit column


@dataclass(frozen=True)
class LimitSpec:
    model: str
    tokens_per_minute: int | None
    requests_per_minute: int | None
    server: bool  # a limit on every workspace's calls (an operator's), not this workspace's


def check_name(name: str) -> None:
    if not NAME.match(name):
        raise DefinitionError(
            [f"limit name {name[:100]!r} must be 1-100 letters, digits, '.', '_' or '-'"],
            "rate limit",
        )


def _per_minute(body: dict[str, Any], key: str, problems: list[str]) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PER_MINUTE:
        problems.append(f"{key} must be an integer from 1 to {MAX_PER_MINUTE}")
        return None
    return value


def parse_limit(body: Any) -> LimitSpec:
    """Validate a definition, raising DefinitionError (422) with every problem."""
    if not isinstance(body, dict):
        raise DefinitionError(["a rate limit is a JSON object"], "rate limit")
    problems = [f"unknown field {k!r}" for k in sorted(set(body) - FIELDS, key=str)]
    match = body.get("match")
    model = match.get("model") if isinstance(match, dict) else None
    if not isinstance(match, dict) or set(match) != {"model"}:
        problems.append('match must be {"model": "GLOB"}, e.g. {"model": "openai/*"}')
    elif not isinstance(model, str) or not 1 <= len(model) <= 200 or not model.isprintable():
        problems.append("match.model must be a glob of 1-200 printable characters")
    tokens = _per_minute(body, "tokensPerMinute", problems)
    requests = _per_minute(body, "requestsPerMinute", problems)
    if body.get("tokensPerMinute") is None and body.get("requestsPerMinute") is None:
        problems.append("give tokensPerMinute, requestsPerMinute or both")
    scope = body.get("scope", "workspace")
    if scope not in SCOPES:
        problems.append(f"scope must be one of {', '.join(SCOPES)}")
    if problems:
        raise DefinitionError(problems, "rate limit")
    assert isinstance(model, str)
    return LimitSpec(model, tokens, requests, scope == "server")
