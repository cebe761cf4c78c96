"""Storage: one narrow interface (``base.Store``) and one package per backend.

The names resolve on first use (PEP 562): a module that needs only the plain records (the API
client's models) imports ``lantern.store.records`` without the interface and its drivers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lantern.store.base import Store, open_store
    from lantern.store.records import (
        AgentVersion,
        Append,
        Blob,
        Event,
        Lease,
        NewEvent,
        Run,
        RunUpdate,
    )

__all__ = [
    "AgentVersion",
    "Append",
    "Blob",
    "Event",
    "Lease",
    "NewEvent",
    "Run",
    "RunUpdate",
    "Store",
    "open_store",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'lantern.store' has no attribute {name!r}")
    home = "lantern.store.base" if name in ("Store", "open_store") else "lantern.store.records"
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
