"""Workloads of bench/vms.py."""

import time

from lantern.workload import Context, entrypoint, resumed


def _now() -> float:
    return time.time()


@entrypoint
async def one(ctx: Context) -> str:
    await ctx.step("first", _now)
    return "ok"


@entrypoint
async def hold(ctx: Context, seconds: float = 10.0) -> str:
    await ctx.step("first", _now)
    await ctx.step("hold", time.sleep, 0.01 if resumed() else seconds)
    return "ok"
