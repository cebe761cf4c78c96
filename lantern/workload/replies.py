"""What a Context call gives back, parsed from what the journal holds: ``ModelReply``,
``Approval``, and a delivery's own key (``key_for``).

Defined once for both sides: the engine's Context (``lantern.app``, which exports these as
``lantern.ModelReply`` and ``lantern.Approval``) and the Context inside a VM
(``lantern.workload.context``) return the same classes parsed the same way, so a workload
reads the same value in a VM as in-process. Standard library only, like the rest of
``lantern.workload``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelReply:
    """A model step's answer as the journal holds it, so a replay returns the same value."""

    text: str
    model: str | None = None
    provider: str | None = None
    usage: Mapping[str, Any] = field(default_factory=dict)
    tool_calls: tuple[Mapping[str, Any], ...] = ()  # each {id, name, arguments}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelReply:
        return cls(
            text=str(data.get("text") or ""),
            model=data.get("model"),
            provider=data.get("provider"),
            usage=dict(data.get("usage") or {}),
            tool_calls=tuple(dict(c) for c in data.get("toolCalls") or ()),
        )


@dataclass(frozen=True)
class Approval:
    """The decision at an approval step: by a person through the API, or by its timeout."""

    decision: str  # "approved" or "rejected"
    by: str | None = None
    comment: str | None = None

    @property
    def approved(self) -> bool:
        return self.decision == "approved"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Approval:
        """The approval step's journaled output (a decision without one counts as rejected)."""
        return cls(data.get("decision", "rejected"), data.get("by"), data.get("comment"))


def key_for(idempotency_key: str, name: str) -> str:
    """An idempotency key of its own for the delivery ``name`` of the step attempt whose key
    is ``idempotency_key``."""
    return hashlib.sha256(f"{idempotency_key}|{name}".encode()).hexdigest()
