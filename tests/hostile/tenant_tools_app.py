"""An app whose tools are not all for every tenant: `ledger` serves the workspace acme only."""

from __future__ import annotations

from typing import Any

import lantern

app = lantern.App()


@app.tool("ledger", workspaces=["acme"])
def ledger(account: str, ctx: lantern.ToolContext) -> dict[str, Any]:
    return {"account": account, "workspace": ctx.workspace}


@app.tool("whoami")
def whoami(ctx: lantern.ToolContext) -> str:
    return ctx.workspace


@app.agent("books")
async def books(ctx: lantern.Context, account: str) -> Any:
    return await ctx.tool("ledger", account=account)
