"""The limits that keep one tenant from exhausting a process every tenant shares (docs/security.md).

Each is refused with a message naming it, so whoever meets one knows which it was and where it
is set. The values are generous for real agents and small enough that meeting one costs the
server little.
"""

from __future__ import annotations

import json
from typing import Any

# JSON nesting: run input, step outputs, HTTP answers. Deeper values would recurse through
# every later copy, dump and render of the value (Python's default stack runs out near 1,000).
MAX_JSON_DEPTH = 100
# Agent definitions: PUT /v1/agents answers 413 past the size, 422 past the counts.
MAX_DEFINITION_BYTES = 1024 * 1024
MAX_NODES = 1000
MAX_EDGES = 10_000
# Sub-agents: how deep a chain of runs starting runs may go, and how many runs one workspace
# may have queued at once (settable: LANTERN_MAX_QUEUED_RUNS).
MAX_SUBAGENT_DEPTH = 10
MAX_QUEUED_RUNS = 1000
# An HTTP connector's answer, read as a stream and refused once past this (decompressed).
MAX_RESPONSE_BYTES = 10 * 1024 * 1024
# A step's output, as an HTTP answer is (settable: LANTERN_MAX_OUTPUT_BYTES).
MAX_OUTPUT_BYTES = 10 * 1024 * 1024


class TooDeep(ValueError):
    """A JSON value nested deeper than MAX_JSON_DEPTH."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"JSON nested deeper than the limit of {limit} levels")


def depth_exceeds(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` nests deeper than ``limit`` lists or objects; iterative, so a deep
    value never exhausts the stack while it is measured."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth + 1 > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def size_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` as JSON would pass ``limit`` bytes, measured without encoding it:
    strings by their length (a lower bound of their UTF-8 form), anything else by a few bytes,
    stopping as soon as the sum passes, so a huge value costs little to refuse."""
    total = 0
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 3
        elif isinstance(item, dict):
            total += 2 + len(item)
            for key, child in item.items():
                stack.append(key if isinstance(key, str) else str(key))
                stack.append(child)
        elif isinstance(item, list | tuple):
            total += 2 + len(item)
            stack.extend(item)
        else:
            total += 4
        if total > limit:
            return True
    return False


def too_large_problem(limit: int) -> str:
    return f"it is larger than the limit of {limit} bytes (LANTERN_MAX_OUTPUT_BYTES)"


def too_deep_problem(limit: int = MAX_JSON_DEPTH) -> str:
    return f"it nests deeper than the limit of {limit} levels"


def check_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> Any:
    """``value``, or TooDeep when it nests past ``limit``."""
    if depth_exceeds(value, limit):
        raise TooDeep(limit)
    return value


def json_too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a JSON request body nests past ``limit``. Counting brackets is C-fast, so only
    a body with more than ``limit`` of them is parsed to measure; a body that is not JSON is
    not this check's business (the route answers 400)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    try:
        value = json.loads(body)
    except RecursionError:
        return True
    except ValueError:
        return False
    return depth_exceeds(value, limit)


def loads(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` that refuses (TooDeep) a value nested past ``limit``."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep(limit) from None
    return check_depth(value, limit)
