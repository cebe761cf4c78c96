"""Flow control settings (docs/flow-control.md): an agent's ``concurrency {key, limit}`` and
``maxConcurrentRuns``, a run's ``priority``, and the concurrency key a run's input renders to.

One parser for every kind of agent: a graph, a plain or a microVM definition, and
``@app.agent(..., concurrency=..., max_concurrent_runs=...)`` (stored in its definition), so
the run's create reads the same fields of whichever version it is pinned to. Which runs start is
decided by the store's claim (lantern/store/claims.py), never here.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import jinja2

from lantern.errors import UsageError
from lantern.sandbox import LimitedEnvironment, render_bounded

DEFAULT_PRIORITY = 5
MIN_PRIORITY, MAX_PRIORITY = 0, 9
MAX_KEY_CHARS = 256  # a rendered concurrency key longer than this is refused at create
MAX_LIMIT = 1_000_000

_ENV = LimitedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False)


def problems(definition: Mapping[str, Any], where: str = "") -> list[str]:
    """What is wrong with the ``concurrency`` and ``maxConcurrentRuns`` of a definition."""
    found: list[str] = []
    if "concurrency" in definition:
        c = definition["concurrency"]
        if not isinstance(c, Mapping) or set(c) != {"key", "limit"}:
            found.append(f"{where}concurrency must be an object {{key, limit}}")
        else:
            key, limit = c["key"], c["limit"]
            if not isinstance(key, str) or not key.strip():
                found.append(f"{where}concurrency.key must be a template over input")
            else:
                error = _syntax_error(key)
                if error is not None:
                    found.append(f"{where}concurrency.key {key!r} does not parse: {error}")
            if not _count(limit):
                found.append(f"{where}concurrency.limit must be an integer from 1 to {MAX_LIMIT}")
    if "maxConcurrentRuns" in definition and not _count(definition["maxConcurrentRuns"]):
        found.append(f"{where}maxConcurrentRuns must be an integer from 1 to {MAX_LIMIT}")
    return found


def settings(definition: Mapping[str, Any]) -> dict[str, Any]:
    """The flow control fields of a (valid) definition, for a code agent's stored one."""
    return {k: definition[k] for k in ("concurrency", "maxConcurrentRuns") if k in definition}


def run_fields(
    concurrency: Any, max_runs: Any, input: Any
) -> tuple[str, int | None, int | None] | None:
    """``(key, limit, maxConcurrentRuns)`` a run of an agent with these settings is claimed
    under, None for an agent without flow control. The key is the template rendered over the
    run's input (``""`` when the agent sets only ``maxConcurrentRuns``); a key that does not
    render is the caller's error (UsageError, 422): the run is not created."""
    if concurrency is None and max_runs is None:
        return None
    if concurrency is None:
        return "", None, int(max_runs)
    template = str(concurrency["key"])
    try:
        key = render_bounded(_template(template), {"input": input})
    except jinja2.TemplateError as exc:
        raise UsageError(
            f"the agent's concurrency.key {template!r} failed on this input: {exc}"
        ) from None
    except Exception as exc:  # a type error in the user's expression, say
        raise UsageError(
            f"the agent's concurrency.key {template!r} failed on this input:"
            f" {type(exc).__name__}: {exc}"
        ) from None
    if len(key) > MAX_KEY_CHARS:
        raise UsageError(
            f"the agent's concurrency.key renders to {len(key)} characters for this input;"
            f" the limit is {MAX_KEY_CHARS}"
        )
    return key, int(concurrency["limit"]), None if max_runs is None else int(max_runs)


def check_priority(priority: Any) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise UsageError(f"priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise UsageError(f"priority must be from {MIN_PRIORITY} to {MAX_PRIORITY} (got {priority})")
    return priority


def code_settings(name: str, concurrency: Any, max_concurrent_runs: Any) -> dict[str, Any]:
    """``@app.agent(concurrency=..., max_concurrent_runs=...)`` as definition fields; a bad
    value is refused when the decorator runs."""
    given: dict[str, Any] = {}
    if concurrency is not None:
        given["concurrency"] = (
            dict(concurrency) if isinstance(concurrency, Mapping) else concurrency
        )
    if max_concurrent_runs is not None:
        given["maxConcurrentRuns"] = max_concurrent_runs
    found = problems(given, f"@app.agent({name!r}): ")
    if found:
        raise UsageError("; ".join(found).replace("maxConcurrentRuns", "max_concurrent_runs"))
    stored: dict[str, Any] = json.loads(json.dumps(given))
    return stored


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_LIMIT


def _syntax_error(text: str) -> str | None:
    try:
        _template(text)
    except jinja2.TemplateSyntaxError as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=1024)
def _template(source: str) -> jinja2.Template:
    return _ENV.from_string(source)
