"""The trigger: the run's entry point, whose output is the run's input."""

from __future__ import annotations

from typing import Any

from lantern.nodes.base import StepContext


async def execute(ctx: StepContext) -> Any:
    return ctx.scope["input"]
