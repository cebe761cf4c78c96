"""Flow control (docs/flow-control.md): answer support tickets one customer at a time.

`answer_ticket` is a code-first agent: at most one run per customer is running at once (a
second ticket from the same customer waits, queued, until the first is answered), and at most
ten runs of it in all. Its `lookup` step stands for a slow call to the customer's account.
`answer-ticket.json` is the same rule on a graph agent.
"""

from __future__ import annotations

import asyncio
from typing import Any

import lantern

app = lantern.App()


@app.agent(
    "answer-ticket-code",
    concurrency={"key": "{{ input.customer }}", "limit": 1},
    max_concurrent_runs=10,
)
async def answer_ticket(ctx: lantern.Context, customer: str, question: str) -> dict[str, Any]:
    async def lookup() -> dict[str, Any]:
        await asyncio.sleep(0.5)  # the account service, a slow peer
        return {"customer": customer, "plan": "pro"}

    account = await ctx.step("lookup", lookup)
    return {"customer": customer, "answer": f"{question} ({account['plan']} plan): on it."}
