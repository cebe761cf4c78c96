"""Storage: one narrow interface (``base.Store``) and one package per backend."""

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
