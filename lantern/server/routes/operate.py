"""Operating runs across a workspace: the approvals waiting on someone, and who the caller is.

``GET /v1/keys/self`` lets a page decide which actions to offer (the key's scopes); the
server still checks every action's scope itself.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request

from lantern.server import auth
from lantern.server.deps import scope, services
from lantern.server.schemas import PROBLEMS, KeyOut, PendingApprovalList
from lantern.store.records import ApiKey

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
    key = await auth.authenticate(services(request).store, request.headers.get("authorization"))
    return {
        "id": key.id,
        "name": key.name,
        "workspace": key.workspace,
        "scopes": sorted(key.scopes),
    }
