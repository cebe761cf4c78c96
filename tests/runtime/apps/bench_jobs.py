"""Workloads of bench/vms.py."""

import time

from lantern.workload import resumed


def _now():
    return time.time()


async def one(ctx):
    await ctx.step("first", _now)
    return "ok"


async def hold(ctx, seconds=10.0):
    await ctx.step("first", _now)
    await ctx.step("hold", time.sleep, 0.01 if resumed() else seconds)
    return "ok"
