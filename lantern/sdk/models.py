"""Typed results of the REST API: frozen dataclasses with snake_case fields.

Each ``from_json`` reads the API's camelCase JSON, parses times into aware datetimes and ignores
members it does not know, so an older SDK keeps working against a newer server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar, cast

from lantern.statuses import TERMINAL, RunStatus

T = TypeVar("T")

__all__ = [
    "Agent",
    "Event",
    "EventPage",
    "Page",
    "PendingApproval",
    "Receipt",
    "Run",
    "RunStatus",
    "Usage",
    "parse_time",
]


@dataclass(frozen=True)
class Usage:
    """Tokens and money a run has spent so far."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    model_calls: int = 0

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Usage:
        data = data or {}
        return cls(
            input_tokens=int(data.get("inputTokens") or 0),
            output_tokens=int(data.get("outputTokens") or 0),
            cost_usd=float(data.get("costUsd") or 0.0),
            model_calls=int(data.get("modelCalls") or 0),
        )


@dataclass(frozen=True)
class Run:
    id: str
    agent_name: str
    agent_version: int
    status: RunStatus
    input: Any
    output: Any
    error: Any
    created_at: datetime
    updated_at: datetime
    usage: Usage = field(default_factory=Usage)
    cancel_requested: bool = False
    parent_run_id: str | None = None  # the run whose subagent step started this one
    children: tuple[str, ...] = ()  # runs its subagent steps started (on get_run only)
    waiting_for: str | None = None  # a code-first run's version no replica that had it has
    priority: int = 5  # 0-9: among runs that may start, higher first
    concurrency_key: str | None = None  # the key its agent's flow control rendered, if any

    @property
    def finished(self) -> bool:
        """Succeeded, failed or cancelled: nothing more will happen to it."""
        return self.status in TERMINAL

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Run:
        return cls(
            id=str(data["id"]),
            agent_name=str(data["agentName"]),
            agent_version=int(data["agentVersion"]),
            status=cast(RunStatus, data["status"]),
            input=data.get("input"),
            output=data.get("output"),
            error=data.get("error"),
            created_at=parse_time(data["createdAt"]),
            updated_at=parse_time(data["updatedAt"]),
            usage=Usage.from_json(data.get("usage")),
            cancel_requested=bool(data.get("cancelRequested", False)),
            parent_run_id=data.get("parentRunId"),
            children=tuple(data.get("children") or ()),
            waiting_for=data.get("waitingForVersion"),
            priority=int(data.get("priority", 5)),
            concurrency_key=data.get("concurrencyKey"),
        )


@dataclass(frozen=True)
class Event:
    """One row of a run's journal."""

    seq: int
    run_id: str
    kind: str
    at: datetime
    data: dict[str, Any]
    step_id: str | None = None
    node_id: str | None = None
    attempt: int | None = None
    hash: str | None = None  # chained to the previous event's (docs/receipts.md)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Event:
        attempt = data.get("attempt")
        return cls(
            seq=int(data["seq"]),
            run_id=str(data["runId"]),
            kind=str(data["kind"]),
            at=parse_time(data["at"]),
            data=dict(data.get("data") or {}),
            step_id=data.get("stepId"),
            node_id=data.get("nodeId"),
            attempt=None if attempt is None else int(attempt),
            hash=data.get("hash"),
        )


@dataclass(frozen=True)
class Delivery:
    """A claimed delivery of a run; ``status`` "unknown" means a crash cut it off mid-send."""

    run_id: str
    step_id: str
    name: str
    attempt: int
    kind: str
    target: str | None
    status: str  # delivered, failed or unknown
    idempotency_key: str
    response: Any = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Delivery:
        return cls(
            run_id=str(data["runId"]),
            step_id=str(data["stepId"]),
            name=str(data["name"]),
            attempt=int(data["attempt"]),
            kind=str(data["kind"]),
            target=data.get("target"),
            status=str(data["status"]),
            idempotency_key=str(data["idempotencyKey"]),
            response=data.get("response"),
        )


@dataclass(frozen=True)
class PendingApproval:
    """An approval a run waits on that nobody has decided yet."""

    run_id: str
    node_id: str
    agent_name: str
    prompt: str | None
    since: datetime

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PendingApproval:
        return cls(
            run_id=str(data["runId"]),
            node_id=str(data["nodeId"]),
            agent_name=str(data.get("agentName", "")),
            prompt=data.get("prompt"),
            since=parse_time(data["since"]),
        )


@dataclass(frozen=True)
class Worker:
    """A replica of ``lantern serve``: its heartbeat and the runs it holds leases on."""

    id: str
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None
    alive: bool
    runs: tuple[str, ...]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Worker:
        stopped = data.get("stoppedAt")
        return cls(
            id=str(data["id"]),
            started_at=parse_time(data["startedAt"]),
            heartbeat_at=parse_time(data["heartbeatAt"]),
            stopped_at=None if stopped is None else parse_time(stopped),
            alive=bool(data["alive"]),
            runs=tuple(str(r) for r in data["runs"]),
        )


@dataclass(frozen=True)
class Agent:
    """One version of an agent definition."""

    name: str
    version: int
    definition: dict[str, Any]
    created_at: datetime

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Agent:
        return cls(
            name=str(data["name"]),
            version=int(data["version"]),
            definition=dict(data["definition"]),
            created_at=parse_time(data["createdAt"]),
        )


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing; pass ``next_cursor`` back as ``cursor`` for the next one."""

    items: tuple[T, ...]
    next_cursor: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any], item: Callable[[Mapping[str, Any]], T]) -> Page[T]:
        cursor = data.get("nextCursor")
        return cls(
            items=tuple(item(x) for x in data["items"]),
            next_cursor=None if cursor is None else str(cursor),
        )


@dataclass(frozen=True)
class EventPage:
    """One page of a journal; ``next_after`` is set while more events remain."""

    items: tuple[Event, ...]
    next_after: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EventPage:
        after = data.get("nextAfter")
        return cls(
            items=tuple(Event.from_json(x) for x in data["items"]),
            next_after=None if after is None else int(after),
        )


@dataclass(frozen=True)
class Receipt:
    """A finished run's signed receipt (docs/receipts.md): ``receipt`` is what was signed,
    ``signature`` its Ed25519 signature (base64url), ``key_id`` the signing key's ``kid``."""

    receipt: dict[str, Any]
    signature: str
    key_id: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Receipt:
        return cls(
            receipt=dict(data["receipt"]),
            signature=str(data["signature"]),
            key_id=str(data["keyId"]),
        )

    def to_json(self) -> dict[str, Any]:
        """The API's answer again, as ``lantern runs export`` writes it beside the events."""
        return {"receipt": self.receipt, "signature": self.signature, "keyId": self.key_id}


def parse_time(value: Any) -> datetime:
    """An ISO 8601 time as the API writes it (``Z`` or an offset)."""
    if not isinstance(value, str):
        raise ValueError(f"not an ISO 8601 time: {value!r}")
    return datetime.fromisoformat(value)
