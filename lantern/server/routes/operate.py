"""Operating runs across a workspace: the approvals waiting on someone, and who the caller is.

``GET /v1/keys/self`` lets a page decide which actions to offer (the key's scopes); the
server still checks every action's scope itself.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from lantern.engine.rerun import retry_run
from lantern.observability import logs
from lantern.server.deps import owned_run, scope, services
from lantern.server.schemas import PROBLEMS, KeyOut, PendingApprovalList, RetryRun, RunOut
from lantern.store.records import ApiKey
from lantern.views import run_json

router = APIRouter(prefix="/v1", tags=["operate"], responses=PROBLEMS)


@router.get("/approvals", response_model=PendingApprovalList)
async def approvals(
    request: Request,
    key: Annotated[ApiKey, Depends(scope("runs:read"))],
    status: Literal["pending"] = "pending",
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> dict[str, Any]:
    """The approvals the workspace's runs wait on with no decision yet, oldest first."""
    found = await services(request).store.pending_approvals(key.workspace, limit)
    return {
        "items": [
            {
                "runId": p.run_id,
                "nodeId": p.node_id,
                "agentName": p.agent_name,
                "prompt": p.prompt,
                "since": p.since.isoformat(),
            }
            for p in found
        ]
    }


@router.get("/keys/self", response_model=KeyOut)
async def whoami(request: Request) -> dict[str, Any]:
    """The calling key: its id, name, workspace and scopes (never its secret)."""
    key = await services(request).authenticate(request)
    return {
        "id": key.id,
        "name": key.name,
        "workspace": key.workspace,
        "scopes": sorted(key.scopes),
    }


@router.post("/runs/{run_id}/retry", status_code=202, response_model=RunOut)
async def retry(
    run_id: str,
    request: Request,
    key: Annotated[ApiKey, Depends(scope("runs:execute"))],
    body: RetryRun | None = None,
) -> JSONResponse:
    """A new run of a failed or cancelled run's agent version: its completed steps before
    ``fromStep`` (all of them, without it) are replayed from the original's journal, the rest
    run again with fresh idempotency keys. 409 for a run that succeeded or has not finished."""
    s = services(request)
    original = await owned_run(s.store, run_id, key)
    from_step = body.fromStep if body is not None else None
    made = await retry_run(s.store, original, from_step, routes=s.worker.models.routes)
    # Its run_started is stored here rather than committed by a drive: log its start line.
    opened = await s.store.events(made.id, limit=1)
    logs.run_events(made.id, made.agent_name, made.agent_version, s.worker.worker_id, opened)
    s.worker.wake()
    return JSONResponse(run_json(made), status_code=202)
