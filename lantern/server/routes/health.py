"""Liveness and Prometheus metrics; neither needs a key."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from lantern.server.deps import services
from lantern.server.problems import problem

router = APIRouter(tags=["health"])


@router.get("/healthz", responses={503: {"description": "the database does not answer"}})
async def healthz(request: Request) -> Any:
    try:
        await services(request).store.get_run("healthz")
    except Exception:
        return problem(503, "the database does not answer")
    return JSONResponse({"status": "ok"})


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
