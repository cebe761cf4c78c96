"""The control plane's app of the guarantee tests: crash_app's tools and agents, and a
code-first agent that calls itself (a chain the sub-agent depth limit must stop), and one of
one step that schedules fire (tests/schedule_kinds.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import lantern
from tests.crash.crash_app import app

__all__ = ["app"]


@app.agent("chain")
async def chain(ctx: lantern.Context, pause: float = 0.0) -> Any:
    if pause:
        await ctx.step("pause", asyncio.sleep, pause)
    return await ctx.run_agent("chain", {"pause": pause})


@app.agent("tick-code")
async def tick(ctx: lantern.Context, **input: Any) -> Any:
    """One step: what a schedule fires at a code-first agent (tests/schedule_kinds.py)."""
    return await ctx.step("tock", lambda: input)
