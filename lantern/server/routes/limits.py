"""/v1/limits: rate limits on model calls, shared by every replica (docs/rate-limits.md).

A limit is the workspace's own (an admin key of it: its runs' calls count) unless it says
``"scope": "server"``: then it counts every workspace's calls, as a provider does with the
server's one key, and only an operator key may set or delete it. A workspace reads its own
limits and the server's, which hold its calls too, each with what its last minute holds.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response

from lantern.models import limit_admin
from lantern.models.limit_spec import check_name, parse_limit
from lantern.server.auth import OPERATOR, require
from lantern.server.deps import services
from lantern.server.schemas import PROBLEMS
from lantern.store.records import ApiKey

router = APIRouter(prefix="/v1/limits", tags=["limits"], responses=PROBLEMS)
Name = Annotated[str, Path(min_length=1, max_length=100)]
Scope = Annotated[Literal["workspace", "server"], Query(alias="scope")]


async def _key(request: Request) -> ApiKey:
    """The request's key: an admin key of a workspace or an operator key (checked per use)."""
    s = services(request)
    key = await s.authenticate(request)
    s.limiter.take(key.id)
    if OPERATOR not in key.scopes:
        require(key, "admin")
    return key


def _may(key: ApiKey, server: bool) -> None:
    """The server's limits are an operator's; a workspace's, its admin's."""
    require(key, OPERATOR if server else "admin")


@router.put("/{name}")
async def put(
    name: Name,
    body: Annotated[dict[str, Any], Body()],
    request: Request,
    key: Annotated[ApiKey, Depends(_key)],
) -> dict[str, Any]:
    check_name(name)
    spec = parse_limit(body)
    _may(key, spec.server)  # a bad body is a 422 before a 403
    limit = await limit_admin.set_limit(services(request).store, key.workspace, name, spec)
    return limit_admin.shown(limit)


@router.get("")
async def list_limits(request: Request, key: Annotated[ApiKey, Depends(_key)]) -> dict[str, Any]:
    return {"items": await limit_admin.list_limits(services(request).store, key.workspace)}


@router.delete("/{name}", status_code=204)
async def delete(
    name: Name,
    request: Request,
    key: Annotated[ApiKey, Depends(_key)],
    within: Scope = "workspace",
) -> Response:
    _may(key, within == "server")
    await limit_admin.delete_limit(services(request).store, key.workspace, name, within == "server")
    return Response(status_code=204)
