"""A Pydantic AI agent made durable, for the real-process tests: ``--app
tests.crash.pydantic_app:app``.

Its model is a ``FunctionModel`` and its one tool a plain function; each appends a line to
``$PAI_LOG`` when it runs, so a test counts model requests and tool calls across processes.
The second model request waits for the file ``$PAI_RELEASE`` to exist, so a test can SIGKILL
the server between the two turns, with the first turn and the tool call completed.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import lantern
from lantern.integrations.pydantic_ai import durable


def _log(**line: Any) -> None:
    with open(os.environ["PAI_LOG"], "a") as out:
        out.write(json.dumps({**line, "pid": os.getpid()}) + "\n")


async def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    turn = sum(isinstance(m, ModelResponse) for m in messages) + 1
    _log(kind="model", turn=turn)
    if turn == 1:
        return ModelResponse(parts=[ToolCallPart("stock", {"item": "lamp"})])
    release = Path(os.environ["PAI_RELEASE"])
    # The release comes from the test's process (a file), which no asyncio.Event can carry;
    # the test kills the server while this waits, or lets it go on.
    while not release.exists():  # noqa: ASYNC110, ASYNC240
        await asyncio.sleep(0.05)
    answer = messages[-1].parts[0]
    assert isinstance(answer, ToolReturnPart) and isinstance(answer.content, dict)
    stocked: Mapping[str, object] = answer.content  # what stock returned
    count = stocked["count"]
    return ModelResponse(parts=[TextPart(f"{count} lamps in stock")])


shop = Agent(FunctionModel(_model), name="shop")


@shop.tool_plain
def stock(item: str) -> dict[str, Any]:
    """How many of an item are in stock."""
    _log(kind="tool", item=item)
    return {"item": item, "count": 7}


app = lantern.App()


@app.agent("shop")
async def run_shop(ctx: lantern.Context, question: str) -> dict[str, Any]:
    result = await durable(shop).run(ctx, question)
    return {"answer": result.output}
