"""What each node type does when its step runs. Nodes never touch the store.

The names resolve on first use (PEP 562): importing one small module of the package, such as
``lantern.nodes.notes`` (which the journal's vocabulary reads), does not load every executor.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lantern.nodes.base import Node, NodeExecutor, StepContext
    from lantern.nodes.registry import executor_for

__all__ = ["Node", "NodeExecutor", "StepContext", "executor_for"]
_HOMES = {
    "Node": "lantern.nodes.base",
    "NodeExecutor": "lantern.nodes.base",
    "StepContext": "lantern.nodes.base",
    "executor_for": "lantern.nodes.registry",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'lantern.nodes' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value
