"""The offline provider (``offline/...`` models): deterministic, no key, no network.

It lets the demo and a first-time user run agents with model steps before any key is set.
``offline/echo`` answers with the last user message (in JSON mode: that message parsed as
JSON, or ``{"text": message}`` when it is not JSON). ``offline/tools`` plays a plain agent's
model: it calls each tool it is offered once, in order, with the arguments it can take from the
user's message, then answers with what the tools returned. Both answer from the conversation
alone, so a re-sent turn gets the same answer. Tokens are counted as one per four characters,
and it costs nothing. Streamed, it sends its answer a word at a time. Everything it answers is
labeled provider ``offline``.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from typing import Any

from lantern.config import offline_word_delay
from lantern.models.records import (
    ModelRequest,
    ModelResponse,
    OnText,
    TokenUsage,
    ToolCall,
    ToolSpec,
)

PREFIX = "offline/"
MODELS = frozenset({"offline/echo", "offline/tools"})


def tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


class OfflineProvider:
    name = "offline"

    async def aclose(self) -> None:
        pass

    def __init__(self, word_delay_s: float | None = None) -> None:
        self.word_delay_s = offline_word_delay() if word_delay_s is None else word_delay_s

    async def complete(self, request: ModelRequest, on_text: OnText | None = None) -> ModelResponse:
        if request.model == "offline/tools":
            answer = _use_tools(request, self.name)
            if on_text is not None and answer.text:
                on_text(answer.text)
            return answer
        users = [m.content for m in request.messages if m.role == "user"]
        prompt = users[-1] if users else ""
        text = prompt
        if request.json:
            try:
                json.loads(prompt)
            except ValueError:
                text = json.dumps({"text": prompt})
        if request.max_tokens is not None:
            text = text[: request.max_tokens * 4]
        if on_text is not None:
            # Streamed a word at a time (LANTERN_OFFLINE_WORD_DELAY apart), so the demo and the
            # browser show live text without a key.
            for word in re.findall(r"\S+\s*|\s+", text):
                on_text(word)
                await asyncio.sleep(self.word_delay_s)
        seen = "".join([request.system or "", *(m.content for m in request.messages)])
        return ModelResponse(
            text=text,
            model=request.model,
            provider=self.name,
            usage=TokenUsage(tokens(seen), tokens(text)),
        )


def _use_tools(request: ModelRequest, provider: str) -> ModelResponse:
    """The next tool not yet called, or, when every one has answered, their answers as JSON."""
    calls = [c for m in request.messages for c in m.tool_calls]
    called = {c.name for c in calls}
    seen = "".join([request.system or "", *(m.content for m in request.messages)])
    pending = [t for t in request.tools if t.name not in called]
    if pending:
        users = [m.content for m in request.messages if m.role == "user"]
        tool = pending[0]
        call = ToolCall(
            f"call_{len(calls) + 1}", tool.name, _arguments(tool, users[0] if users else "")
        )
        return ModelResponse("", request.model, provider, TokenUsage(tokens(seen), 0), (call,))
    names = {c.id: c.name for c in calls}
    answers: dict[str, Any] = {}
    for m in request.messages:
        if m.role == "tool" and m.tool_call_id in names:
            try:
                answers[names[m.tool_call_id]] = json.loads(m.content)
            except ValueError:
                answers[names[m.tool_call_id]] = m.content
    text = json.dumps(answers) if answers else "no tools to call"
    return ModelResponse(text, request.model, provider, TokenUsage(tokens(seen), tokens(text)))


def _arguments(tool: ToolSpec, message: str) -> dict[str, Any]:
    """The tool's parameters that the user's message, a JSON object, has values for; a tool of
    one parameter takes a message that is not an object as that parameter."""
    params = list((tool.parameters.get("properties") or {}).keys())
    try:
        found = json.loads(message)
    except ValueError:
        found = message
    if isinstance(found, dict):
        return {p: found[p] for p in params if p in found}
    return {params[0]: found} if len(params) == 1 else {}
