"""Liveness, readiness and Prometheus metrics; none needs a key (metrics do with
LANTERN_METRICS=admin)."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from lantern.engine.commits import WriteHealth
from lantern.engine.readiness import not_ready
from lantern.errors import Forbidden
from lantern.observability import metrics as observed
from lantern.observability import storage
from lantern.server import auth
from lantern.server.deps import services
from lantern.server.problems import problem

router = APIRouter(tags=["health"])
log = logging.getLogger("lantern.server")


@router.get("/healthz")
async def healthz() -> Any:
    """Liveness: the process answers. It does not look at the database, so an outage of the
    database does not get every replica restarted; ``/readyz`` does."""
    return JSONResponse({"status": "ok"})


@router.get("/readyz", responses={503: {"description": "the store cannot write"}})
async def readyz(request: Request) -> Any:
    """Readiness: fails (503) while the store cannot write, naming why."""
    s = services(request)
    worker = s.worker
    health = worker.runner.write_health if worker.runner is not None else WriteHealth()
    why = await not_ready(s.store, worker.worker_id, worker.started_at, health)
    if why is not None:
        return problem(503, f"not ready: {why}")
    return JSONResponse({"status": "ready"})


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> Response:
    s = services(request)
    if not s.settings.metrics_public:
        # LANTERN_METRICS=admin: an admin key of the operator's workspace (or, with none
        # named, any admin key) reads them.
        key = await s.authenticate(request)
        auth.require(key, "admin")
        operator = s.settings.operator_workspace
        if operator is not None and key.workspace != operator:
            raise Forbidden("/metrics is the operator's: use an admin key of its workspace")
    try:
        g = await services(request).store.gauges()
        kept = await services(request).store.storage_gauges()
    except Exception:  # the database away: the process's own counters still answer
        log.warning("gauges not read: the database does not answer", exc_info=True)
    else:
        age = None if g.oldest_queued is None else time.time() - g.oldest_queued.timestamp()
        observed.set_gauges(g.runs, g.leases_held, age)
        storage.set_storage(kept.oldest_finished, kept.database_bytes)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
