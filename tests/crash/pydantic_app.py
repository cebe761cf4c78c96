"""A Pydantic AI agent made durable, for the real-process tests: ``--app
tests.crash.pydantic_app:app``.

``clerk``: a real ``OpenAIChatModel`` sent to ``$OPENAI_BASE_URL`` (the fake provider of
tests/fake_llm.py), whose tool takes ``RunContext`` deps and appends a line to ``$PAI_LOG``
when it runs, so a test counts its calls across processes. With ``stream`` the agent waits
for an approval first (so a follower is in place) and runs with ``run_stream``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import lantern
from lantern.integrations.pydantic_ai import durable


def _log(**line: Any) -> None:
    with open(os.environ["PAI_LOG"], "a") as out:
        out.write(json.dumps({**line, "pid": os.getpid()}) + "\n")


app = lantern.App()


@dataclass
class Shelf:
    """The clerk's deps: what is in stock."""

    counts: dict[str, int]


# The base URL is read when the module is imported: the server process gets it in its env.
clerk = Agent(
    OpenAIChatModel(
        "gpt-4o-mini",
        provider=OpenAIProvider(
            base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:9/v1"),
            api_key=os.environ.get("OPENAI_API_KEY", "sk-test"),
        ),
    ),
    name="clerk",
    deps_type=Shelf,
    instructions="Answer from the stock tool.",
)


@clerk.tool
async def count(ctx: RunContext[Shelf], item: str) -> dict[str, Any]:
    """How many of an item are in stock."""
    _log(kind="tool", item=item)
    return {"item": item, "count": ctx.deps.counts.get(item, 0)}


@app.agent("clerk")
async def run_clerk(ctx: lantern.Context, question: str, stream: bool = False) -> dict[str, Any]:
    shelf = Shelf({"lamp": 7})
    if stream:
        await ctx.approval("ok", prompt="Go?")
        retry = {"maxAttempts": 2, "backoffMs": 50, "retryableClasses": ["llm"]}
        streamed = await durable(clerk, model_retry=retry).run_stream(ctx, question, deps=shelf)
        return {"answer": streamed.output}
    result = await durable(clerk).run(ctx, question, deps=shelf)
    return {"answer": result.output}
