"""The demo's tools, loaded by `lantern serve --app lantern.demo.app:app`."""

from __future__ import annotations

import lantern

app = lantern.App()

_CUSTOMERS = {"c-42": {"name": "Ada Lovelace", "email": "ada@example.test", "tier": "gold"}}


@app.tool("crm.lookup")
async def lookup(id: str) -> dict[str, object]:
    """Find a customer by id."""
    return {"id": id, **_CUSTOMERS.get(id, {"name": "unknown", "tier": "none"})}
