"""/v1/workers: the replicas, their heartbeats and the runs they hold (admin only)."""

from __future__ import annotations

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
    return {"items": [worker_json(w, stale) for w in await s.store.list_workers()]}
