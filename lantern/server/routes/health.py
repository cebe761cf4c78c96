"""Liveness and Prometheus metrics; neither needs a key."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from lantern.observability import metrics as observed
from lantern.server.deps import services
from lantern.server.problems import problem

router = APIRouter(tags=["health"])
log = logging.getLogger("lantern.server")


@router.get("/healthz", responses={503: {"description": "the database does not answer"}})
async def healthz(request: Request) -> Any:
    try:
        await services(request).store.get_run("healthz")
    except Exception:
        return problem(503, "the database does not answer")
    return JSONResponse({"status": "ok"})


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> Response:
    try:
        g = await services(request).store.gauges()
    except Exception:  # the database away: the process's own counters still answer
        log.warning("gauges not read: the database does not answer", exc_info=True)
    else:
        age = None if g.oldest_queued is None else time.time() - g.oldest_queued.timestamp()
        observed.set_gauges(g.runs, g.leases_held, age)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
