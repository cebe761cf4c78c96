"""An app whose tools and agents are not all for every tenant: the tool `ledger` and the
code-first agent `acme-books` serve the workspace acme only."""

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


@app.agent("acme-books", workspaces=["acme"])
async def acme_books(ctx: lantern.Context) -> str:
    return "acme's own"
