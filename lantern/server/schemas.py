"""Request and response bodies of the REST API, for validation and the OpenAPI document."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateRun(Body):
    agentName: str = Field(min_length=1, max_length=100)
    input: Any = None
    # Among runs that may start, a higher priority starts first (docs/flow-control.md).
    priority: int = Field(default=5, ge=0, le=9, strict=True)


class Decision(Body):
    decision: Literal["approve", "reject"]
    comment: str | None = Field(default=None, max_length=10_000)


class Resume(Body):
    version: str = Field(min_length=1, max_length=100)


class SendSignal(Body):
    payload: Any = None


class SignalOut(BaseModel):
    id: str
    name: str
    runId: str


class DecisionOut(BaseModel):
    runId: str
    nodeId: str
    decision: Literal["approved", "rejected"]
    decidedBy: str
    decidedByName: str | None = None  # the deciding key's name
    comment: str | None


class Usage(BaseModel):
    inputTokens: int
    outputTokens: int
    costUsd: float
    modelCalls: int


class RunOut(BaseModel):
    id: str
    agentName: str
    agentVersion: int
    status: Literal["queued", "running", "waiting", "succeeded", "failed", "cancelled"]
    input: Any = None
    output: Any = None
    error: Any = None
    createdAt: str
    updatedAt: str
    usage: Usage
    cancelRequested: bool
    parentRunId: str | None = None
    children: list[str] | None = None  # on GET /v1/runs/{id}: the runs its sub-agents started
    # on GET /v1/runs/{id}: {name, fireTime} of the schedule fire that created it
    schedule: dict[str, str] | None = None
    # A code-first run left by a replica without its version: the version of its code it
    # waits for (``lantern runs resume RUN_ID --version NEW`` moves it on).
    waitingForVersion: str | None = None
    priority: int = 5
    # The concurrency key its agent's flow control rendered from its input, if any.
    concurrencyKey: str | None = None


class RunPage(BaseModel):
    items: list[RunOut]
    nextCursor: str | None


class EventOut(BaseModel):
    seq: int
    runId: str
    stepId: str | None
    nodeId: str | None
    kind: str
    attempt: int | None
    data: dict[str, Any]
    at: str
    hash: str | None = None  # chained to the previous event's (docs/receipts.md)


class WorkspaceSettingsIn(Body):
    retention: str | None = Field(max_length=40)


class WorkspaceSettingsOut(BaseModel):
    workspace: str
    retention: str | None  # the workspace's own, a Go duration; null: the server's applies
    serverRetention: str | None  # LANTERN_RETENTION
    effectiveRetention: str | None  # what the retention pass applies; null: runs are kept


class EventPage(BaseModel):
    items: list[EventOut]
    nextAfter: int | None


class DeliveryOut(BaseModel):
    runId: str
    stepId: str
    name: str
    attempt: int
    kind: str
    target: str | None
    status: Literal["unknown", "delivered", "failed"]
    idempotencyKey: str
    response: Any = None
    claimedAt: str | None
    completedAt: str | None


class DeliveryList(BaseModel):
    items: list[DeliveryOut]


class AgentOut(BaseModel):
    name: str
    version: int
    definition: dict[str, Any]
    createdAt: str
    kind: Literal["graph", "plain", "code"] = "graph"
    codeVersion: str | None = None  # a code-first agent's: its source digest or given version
    module: str | None = None  # a code-first agent's: the module that defines it


class SecretIn(Body):
    value: Any  # checked by the vault, so no validation message ever quotes it


class SecretOut(BaseModel):
    name: str
    createdAt: str
    updatedAt: str


class SecretPage(BaseModel):
    items: list[SecretOut]


class AgentPage(BaseModel):
    items: list[AgentOut]
    nextCursor: str | None


class WorkerOut(BaseModel):
    id: str
    startedAt: str
    heartbeatAt: str
    stoppedAt: str | None
    alive: bool
    runs: list[str]


class WorkerPage(BaseModel):
    items: list[WorkerOut]


class Problem(BaseModel):
    type: str
    title: str
    status: int
    detail: str
    errors: list[str] | None = None


# Error answers are documented as application/problem+json of the Problem schema (openapi.py
# puts the schema in); FastAPI's "model" would document them as application/json.
PROBLEMS: dict[int | str, dict[str, Any]] = {
    status: {
        "description": description,
        "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        },
    }
    for status, description in (
        (400, "malformed body"),
        (401, "no, unknown or revoked API key"),
        (403, "missing scope, or another workspace's object"),
        (404, "unknown run or agent"),
        (409, "conflict"),
        (413, "body too large"),
        (422, "invalid definition or input"),
    )
}


class ReceiptBody(BaseModel):
    """The signed receipt (docs/receipts.md); it may gain members, never lose them."""

    model_config = ConfigDict(extra="allow")
    version: int
    runId: str
    workspace: str
    agentName: str
    agentVersion: int
    status: Literal["succeeded", "failed", "cancelled"]
    eventCount: int
    journalHead: str = Field(pattern="^sha256:[0-9a-f]{64}$")
    outputDigest: str = Field(pattern="^sha256:[0-9a-f]{64}$")
    usage: Usage
    issuedAt: str
    keyId: str


class ReceiptOut(BaseModel):
    receipt: ReceiptBody
    signature: str
    keyId: str


class Jwk(BaseModel):
    model_config = ConfigDict(extra="allow")
    kty: Literal["OKP"]
    crv: Literal["Ed25519"]
    kid: str
    x: str


class JwkSet(BaseModel):
    keys: list[Jwk]


class PendingApprovalOut(BaseModel):
    runId: str
    nodeId: str
    agentName: str
    prompt: str | None
    since: str


class PendingApprovalList(BaseModel):
    items: list[PendingApprovalOut]


class KeyOut(BaseModel):
    id: str
    name: str | None
    workspace: str
    scopes: list[str]


class RetryRun(Body):
    fromStep: str | None = Field(default=None, min_length=1, max_length=200)
