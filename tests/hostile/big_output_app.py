"""A code-first agent whose step returns ``mb`` megabytes of text."""

from __future__ import annotations

from typing import Any

import lantern

app = lantern.App()


@app.agent("huge")
async def huge(ctx: lantern.Context, mb: int) -> Any:
    text = await ctx.step("make", lambda: "x" * (mb * 1_000_000))
    return len(text)
