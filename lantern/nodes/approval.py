"""An approval node parks the run until someone decides (or its timeout does)."""

from __future__ import annotations

import time
from typing import Any

from lantern.nodes.base import StepContext, Waiting


async def execute(ctx: StepContext) -> Any:
    data: dict[str, Any] = {
        "kind": "approval",
        "prompt": ctx.render("prompt", ""),
        "assignees": ctx.render("assignees", []),
    }
    timeout = ctx.node.data.get("timeoutMs")
    if timeout is not None:
        data["dueAt"] = int(time.time() * 1000) + int(timeout)
        data["onTimeout"] = ctx.node.data.get("onTimeout", "reject")
    return Waiting(data)
