"""The control plane's app of the guarantee tests: crash_app's tools and agents, and a
code-first agent that calls itself (a chain the sub-agent depth limit must stop)."""

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
