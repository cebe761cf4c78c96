"""/v1/workspace/settings: a workspace's own settings (admin); today its retention."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request

from lantern.durations import format_duration, parse_duration
from lantern.errors import UsageError
from lantern.server.deps import scope, services
from lantern.server.schemas import PROBLEMS, WorkspaceSettingsIn, WorkspaceSettingsOut
from lantern.store.records import ApiKey

router = APIRouter(prefix="/v1/workspace", tags=["workspace"], responses=PROBLEMS)

LONGEST = 100 * 365 * 86400.0  # a century: anything longer is a typo, not a policy


def _seconds(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = parse_duration(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= LONGEST:
        raise UsageError(f"retention {text!r} is not a positive Go duration (e.g. 720h)")
    return value


async def _settings(request: Request, workspace: str) -> dict[str, Any]:
    s = services(request)
    own = await s.store.workspace_retention(workspace)
    default = s.settings.retention
    effective = own if own is not None else default
    return {
        "workspace": workspace,
        "retention": None if own is None else format_duration(own),
        "serverRetention": None if default is None else format_duration(default),
        "effectiveRetention": None if effective is None else format_duration(effective),
    }


@router.get("/settings", response_model=WorkspaceSettingsOut)
async def get_settings(
    request: Request, key: Annotated[ApiKey, Depends(scope("admin"))]
) -> dict[str, Any]:
    return await _settings(request, key.workspace)


@router.put("/settings", response_model=WorkspaceSettingsOut)
async def put_settings(
    body: Annotated[WorkspaceSettingsIn, Body()],
    request: Request,
    key: Annotated[ApiKey, Depends(scope("admin"))],
) -> dict[str, Any]:
    """``retention``: how long the workspace's finished runs are kept, a Go duration; null
    gives the server's ``LANTERN_RETENTION`` back (unset there: runs are kept)."""
    seconds = _seconds(body.retention)
    await services(request).store.set_workspace_retention(key.workspace, seconds)
    return await _settings(request, key.workspace)
