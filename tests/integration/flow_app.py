"""The app tests/integration/test_flow_control.py serves: a code-first agent, one run per
customer at a time, whose one step calls the peer at ``/code/CUSTOMER``."""

from __future__ import annotations

from typing import Any

import httpx

import lantern

app = lantern.App()


@app.agent("code-per-customer", concurrency={"key": "{{ input.customer }}", "limit": 1})
async def per_customer(ctx: lantern.Context, customer: str, peer: str) -> Any:
    async def call() -> Any:
        async with httpx.AsyncClient(timeout=30) as http:
            return (await http.post(f"{peer}/code/{customer}", json={})).json()

    return await ctx.step("call", call)
