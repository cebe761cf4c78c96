"""/v1/limits: rate limits on model calls, shared by every replica (docs/rate-limits.md).

A limit is the workspace's own (an admin key of it: its runs' calls count) unless it says
``"scope": "server"``: then it counts every workspace's calls, as a provider does with the
server's one key, and only an operator key may set or delete it. A workspace reads its own
limits and the server's, which hold its calls too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response

from lantern.errors import NotFound, UsageError
from lantern.models.limit_spec import check_name, parse_limit
from lantern.models.throttle import definitions
from lantern.server import auth
from lantern.server.auth import OPERATOR, require
from lantern.server.deps import services
from lantern.server.schemas import PROBLEMS
from lantern.store.model_limits import SERVER, limit_json
from lantern.store.records import ApiKey

MAX_LIMITS = 100  # per workspace (and for the server): each model call reads them all
router = APIRouter(prefix="/v1/limits", tags=["limits"], responses=PROBLEMS)
Name = Annotated[str, Path(min_length=1, max_length=100)]
Scope = Annotated[Literal["workspace", "server"], Query(alias="scope")]


async def _key(request: Request) -> ApiKey:
    """The request's key: an admin key of a workspace or an operator key (checked per use)."""
    s = services(request)
    key = await auth.authenticate(s.store, request.headers.get("authorization"))
    s.limiter.take(key.id)
    if OPERATOR not in key.scopes:
        require(key, "admin")
    return key


def _scope(key: ApiKey, server: bool) -> str:
    """Where a limit lives: the server's limits are an operator's; a workspace's, its admin's."""
    if server:
        require(key, OPERATOR)
        return SERVER
    require(key, "admin")
    return key.workspace


@router.put("/{name}")
async def put(
    name: Name,
    body: Annotated[dict[str, Any], Body()],
    request: Request,
    key: Annotated[ApiKey, Depends(_key)],
) -> dict[str, Any]:
    check_name(name)
    spec = parse_limit(body)
    where = _scope(key, spec.server)
    store = services(request).store
    if await store.get_limit(where, name) is None:
        if len(await store.list_limits((where,))) >= MAX_LIMITS:
            raise UsageError(
                f"at most {MAX_LIMITS} rate limits per workspace (and for the server): every"
                " model call reads them; delete one first"
            )
    limit = await store.put_limit(
        where, name, spec.model, spec.tokens_per_minute, spec.requests_per_minute
    )
    definitions.forget()
    return limit_json(limit)


@router.get("")
async def list_limits(request: Request, key: Annotated[ApiKey, Depends(_key)]) -> dict[str, Any]:
    found = await services(request).store.list_limits((key.workspace, SERVER))
    return {"items": [limit_json(limit) for limit in found]}


@router.delete("/{name}", status_code=204)
async def delete(
    name: Name,
    request: Request,
    key: Annotated[ApiKey, Depends(_key)],
    within: Scope = "workspace",
) -> Response:
    where = _scope(key, within == "server")
    if not await services(request).store.delete_limit(where, name):
        raise NotFound(f"rate limit {name!r} not found")
    definitions.forget()
    return Response(status_code=204)
