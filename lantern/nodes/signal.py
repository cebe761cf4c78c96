"""A signal node parks the run until the signal it names is sent to the run (or its timeout
passes); the step ledger decides which signal it takes (docs/signals.md). Its output is
``{"received": true, "payload": ...}``, or ``{"received": false}`` after the timeout."""

from __future__ import annotations

import time
from typing import Any

from lantern.nodes.base import StepContext, Waiting


async def execute(ctx: StepContext) -> Any:
    # The wait the engine's ``payloads.SignalWait`` reads.
    data: dict[str, Any] = {"kind": "signal", "name": ctx.node.data["name"], "envelope": True}
    timeout = ctx.node.data.get("timeoutMs")
    if timeout is not None:
        data["dueAt"] = int(time.time() * 1000) + int(timeout)
    return Waiting(data)
