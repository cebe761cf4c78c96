"""A code-first agent whose approval names who may decide it."""

from __future__ import annotations

import lantern

app = lantern.App()


@app.agent("signoff")
async def signoff(ctx: lantern.Context) -> str:
    verdict = await ctx.approval("ship", prompt="Ship it?", assignees=["alice"])
    return f"{verdict.decision} by {verdict.by}"
