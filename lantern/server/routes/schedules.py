"""/v1/schedules: schedules that start runs (docs/schedules.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Request, Response
from fastapi.responses import JSONResponse

from lantern.engine.schedules import apply_schedule, trigger
from lantern.errors import NotFound
from lantern.server.deps import scope, services
from lantern.server.schemas import PROBLEMS
from lantern.store.records import ApiKey
from lantern.store.schedules import schedule_json
from lantern.views import run_json

router = APIRouter(prefix="/v1/schedules", tags=["schedules"], responses=PROBLEMS)
Name = Annotated[str, Path(min_length=1, max_length=100)]


@router.put("/{name}")
async def put(
    name: Name,
    body: Annotated[dict[str, Any], Body()],
    request: Request,
    key: Annotated[ApiKey, Depends(scope("agents:write"))],
) -> dict[str, Any]:
    s = services(request)
    schedule = await apply_schedule(s.store, key.workspace, name, body, app=s.worker.app)
    s.worker.schedules.wake()
    return schedule_json(schedule)


@router.get("")
async def list_schedules(
    request: Request, key: Annotated[ApiKey, Depends(scope("agents:read"))]
) -> dict[str, Any]:
    found = await services(request).store.list_schedules(key.workspace)
    return {"items": [schedule_json(s) for s in found]}


@router.get("/{name}")
async def get(
    name: Name, request: Request, key: Annotated[ApiKey, Depends(scope("agents:read"))]
) -> dict[str, Any]:
    s = await services(request).store.get_schedule(key.workspace, name)
    if s is None:
        raise NotFound(f"schedule {name!r} not found")
    return schedule_json(s)


@router.delete("/{name}", status_code=204)
async def delete(
    name: Name, request: Request, key: Annotated[ApiKey, Depends(scope("agents:write"))]
) -> Response:
    if not await services(request).store.delete_schedule(key.workspace, name):
        raise NotFound(f"schedule {name!r} not found")
    return Response(status_code=204)


@router.post("/{name}/trigger", status_code=202)
async def trigger_now(
    name: Name, request: Request, key: Annotated[ApiKey, Depends(scope("runs:execute"))]
) -> JSONResponse:
    s = services(request)
    run = await trigger(s.store, key.workspace, name, app=s.worker.app)
    s.worker.wake()
    return JSONResponse(run_json(run), status_code=202)
