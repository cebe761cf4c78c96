"""The signals example (docs/signals.md), served with
`lantern serve --app-dir examples/signals --app signals_app:app`.

``checkout`` is a code-first agent that parks until its order is paid (a payment webhook
would send the signal) or a day passes; ``fulfil`` is the tool the graph version,
``order.json``, calls once its ``signal`` node has the payment.
"""

from __future__ import annotations

from typing import Any

import lantern

app = lantern.App()

DAY = 24 * 3600


@app.tool("orders.fulfil")
def fulfil(order: str, paid: Any) -> dict[str, Any]:
    """Ship the order; a real deployment would call the warehouse here."""
    return {"order": order, "shipped": True, "paid": paid}


@app.agent("checkout")
async def checkout(ctx: lantern.Context, order: str) -> dict[str, Any]:
    # Parks here holding no lease and no slot; any replica resumes it when the signal comes.
    paid = await ctx.wait_for_signal("payment", timeout_s=DAY)
    if paid is None:  # a day without a payment (journaled as a timeout)
        return {"order": order, "status": "expired"}
    shipped = await ctx.step("fulfil", fulfil, order, paid)
    return {"order": order, "status": "shipped", "shipment": shipped}
