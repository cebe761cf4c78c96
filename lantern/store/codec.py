"""JSON in and out of the database, the same way for every backend."""

from __future__ import annotations

import json
from typing import Any


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def loads_or_none(text: str | None) -> Any:
    return None if text is None else json.loads(text)
