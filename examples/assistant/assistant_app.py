"""The order assistant's tools, served with
`lantern serve --app-dir examples/assistant --app assistant_app:app`.

A plain LLM agent (assistant.json) decides which of these to call; each call is a journaled
step, so a crash never calls a finished one again.
"""

from __future__ import annotations

import lantern

app = lantern.App()

_ORDERS = {
    "A-17": {"status": "shipped", "carrier": "DHL", "days": 2},
    "B-42": {"status": "packing", "carrier": "UPS", "days": 5},
}


@app.tool("orders.status")
async def status(order_id: str) -> dict[str, str]:
    """The order's status and carrier."""
    order = _ORDERS.get(order_id)
    if order is None:
        raise lantern.StepError(f"no order {order_id}", error_class="tool", retryable=False)
    return {"order": order_id, "status": str(order["status"]), "carrier": str(order["carrier"])}


@app.tool("orders.eta")
async def eta(order_id: str) -> dict[str, object]:
    """How many days until the order arrives."""
    order = _ORDERS.get(order_id)
    return {"order": order_id, "days": order["days"] if order else None}
