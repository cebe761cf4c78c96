"""/v1/secrets: a workspace's secrets. A write takes a value; a read lists names and times,
never a value (docs/security.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Request, Response

from lantern.errors import NotFound
from lantern.server.deps import scope, services
from lantern.server.schemas import PROBLEMS, SecretIn, SecretOut, SecretPage
from lantern.store.records import ApiKey, SecretInfo

router = APIRouter(prefix="/v1/secrets", tags=["secrets"], responses=PROBLEMS)
Name = Annotated[str, Path(min_length=1, max_length=64)]


def _json(info: SecretInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "createdAt": info.created_at.isoformat(),
        "updatedAt": info.updated_at.isoformat(),
    }


@router.put("/{name}", response_model=SecretOut)
async def put(
    name: Name,
    body: Annotated[SecretIn, Body()],
    request: Request,
    key: Annotated[ApiKey, Depends(scope("secrets:write"))],
) -> dict[str, Any]:
    info = await services(request).vault.set(key.workspace, name, body.value)
    return _json(info)


@router.get("", response_model=SecretPage)
async def list_secrets(
    request: Request, key: Annotated[ApiKey, Depends(scope("secrets:read"))]
) -> dict[str, Any]:
    return {"items": [_json(i) for i in await services(request).vault.list(key.workspace)]}


@router.delete("/{name}", status_code=204)
async def delete(
    name: Name, request: Request, key: Annotated[ApiKey, Depends(scope("secrets:write"))]
) -> Response:
    if not await services(request).vault.delete(key.workspace, name):
        raise NotFound(f"secret {name} not found")
    return Response(status_code=204)
