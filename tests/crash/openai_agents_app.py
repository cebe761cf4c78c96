"""Two OpenAI Agents SDK agents made durable, for the real-process tests: ``--app
tests.crash.openai_agents_app:app``.

``triage`` hands off to ``billing``, whose ``refund`` tool appends a line to ``$OA_LOG`` when
it runs, so a test counts its calls across processes. Their model is ``gpt-4o-mini`` through
an OpenAI provider sent to ``$OPENAI_BASE_URL`` (the fake provider of tests/fake_llm.py, which
speaks chat completions), with the SDK's tracing off (it would send traces to OpenAI).
"""

from __future__ import annotations

import json
import os
from typing import Any

from agents import Agent, RunConfig, function_tool
from agents.models.openai_provider import OpenAIProvider

import lantern
from lantern.integrations.openai_agents import durable


@function_tool
def refund(order: str) -> str:
    """Refund an order."""
    with open(os.environ["OA_LOG"], "a") as out:
        out.write(json.dumps({"kind": "refund", "order": order, "pid": os.getpid()}) + "\n")
    return f"refunded {order}"


billing = Agent(name="billing", model="gpt-4o-mini", tools=[refund], instructions="Refund.")
triage = Agent(name="triage", model="gpt-4o-mini", handoffs=[billing], instructions="Route.")

app = lantern.App()


@app.agent("support")
async def support(ctx: lantern.Context, question: str) -> dict[str, Any]:
    config = RunConfig(
        model_provider=OpenAIProvider(
            base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:9/v1"),
            api_key=os.environ.get("OPENAI_API_KEY", "sk-test"),
            use_responses=False,
        ),
        tracing_disabled=True,
    )
    result = await durable(triage, name="support").run(ctx, question, run_config=config)
    return {"answer": result.final_output, "agent": result.last_agent.name}
