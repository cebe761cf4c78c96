"""/v1/workers: the replicas, their heartbeats and the runs they hold (admin only). An admin
key sees its own workspace's runs; one of LANTERN_OPERATOR_WORKSPACE sees every run."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from lantern.server.deps import scope, services
from lantern.server.schemas import PROBLEMS, WorkerPage
from lantern.store.records import ApiKey, WorkerInfo

router = APIRouter(prefix="/v1/workers", tags=["workers"], responses=PROBLEMS)


def worker_json(w: WorkerInfo, stale_after: timedelta) -> dict[str, Any]:
    alive = w.stopped_at is None and datetime.now(UTC) - w.heartbeat_at < stale_after
    return {
        "id": w.id,
        "startedAt": w.started_at.isoformat(),
        "heartbeatAt": w.heartbeat_at.isoformat(),
        "stoppedAt": w.stopped_at.isoformat() if w.stopped_at else None,
        "alive": alive,
        "runs": list(w.runs),
    }


@router.get("", response_model=WorkerPage)
async def list_workers(
    request: Request, key: Annotated[ApiKey, Depends(scope("admin"))]
) -> dict[str, Any]:
    s = services(request)
    # A replica heartbeats at least every TTL/3 (and every 5 s); three misses mean it is gone.
    stale = timedelta(seconds=3 * min(s.settings.lease_ttl / 3, 5.0) + 1)
    found = await s.store.list_workers()
    if key.workspace != s.settings.operator_workspace:
        # A workspace's admin sees the replicas, and only its own workspace's runs on them.
        held = [r for w in found for r in w.runs]
        mine = await s.store.runs_in_workspace(key.workspace, held) if held else set()
        found = [dataclasses.replace(w, runs=tuple(r for r in w.runs if r in mine)) for w in found]
    return {"items": [worker_json(w, stale) for w in found]}
