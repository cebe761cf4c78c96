"""Connector nodes: deliveries to the outside world (http now; email in its own issue)."""

from __future__ import annotations

from typing import Any

from lantern.effects import http
from lantern.nodes.base import StepContext


async def execute(ctx: StepContext) -> Any:
    return await http.send(
        ctx.http,
        method=str(ctx.node.data.get("method", "POST")).upper(),
        url=ctx.render("url"),
        headers=ctx.render("headers", {}),
        body=ctx.render("body"),
        idempotency_key=ctx.idempotency_key,
        timeout_s=float(ctx.node.data.get("timeoutMs", 30_000)) / 1000,
    )
