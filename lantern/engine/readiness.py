"""Readiness: can this replica take work now? Only if its store can write.

Liveness (``/healthz``) says the process serves requests; readiness (``/readyz``) says it can
also make progress, so a load balancer stops sending runs while the database is away or the
disk is full. Two looks: whether this process's journal commits are failing right now (a
commit that keeps failing while a small write still passes, as on a nearly full disk), and a
small real write (the replica's heartbeat) bounded by a timeout.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from lantern.engine.commits import WriteHealth
from lantern.store.base import Store

PROBE_TIMEOUT = 3.0  # seconds a probe write may take before the store counts as not writing


async def not_ready(
    store: Store, worker_id: str, started_at: datetime, health: WriteHealth
) -> str | None:
    """Why the replica is not ready, or None when it is."""
    if health.failing_since is not None:
        return f"journal commits are failing: {health.cause}"
    try:
        await asyncio.wait_for(store.heartbeat(worker_id, started_at), PROBE_TIMEOUT)
    except TimeoutError:
        return f"the database did not complete a write within {PROBE_TIMEOUT:g} s"
    except Exception as exc:
        return f"the database cannot write: {exc}"
    return None
