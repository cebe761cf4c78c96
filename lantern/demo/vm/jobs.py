"""The workload of `lantern demo microvm`: three steps, the second one slow the first time."""

from __future__ import annotations

import time
from typing import Any

from lantern.workload import entrypoint, resumed


def _fetch(n: int) -> dict[str, Any]:
    return {"pages": [f"page-{i}" for i in range(n)], "fetched_at": time.time()}


def _count(pages: list[str], hold: float) -> dict[str, int]:
    time.sleep(hold)
    return {"words": 120 * len(pages)}


@entrypoint
async def count_words(ctx: Any, pages: int = 3) -> dict[str, Any]:
    fetched = await ctx.step("fetch", _fetch, pages)
    counted = await ctx.step("count", _count, fetched["pages"], 0.2 if resumed() else 60)
    summary = await ctx.step("summary", lambda: f"{counted['words']} words in {pages} pages")
    return {"summary": summary, "resumed": resumed()}
