"""The app two replicas load in tests/integration/test_rate_limits_fleet.py: a code-first agent
whose one model call is held to the rate limits like a graph's or a plain agent's."""

from __future__ import annotations

import lantern

app = lantern.App()


@app.agent("code")
async def code(ctx: lantern.Context, who: str) -> str:
    reply = await ctx.model("gpt-4o-mini", prompt=f"Say hi to {who}", name="draft", max_tokens=30)
    return reply.text
