"""The offline provider (``offline/...`` models): deterministic, no key, no network.

It lets the demo and a first-time user run agents with model steps before any key is set.
``offline/echo`` answers with the last user message (in JSON mode: that message parsed as
JSON, or ``{"text": message}`` when it is not JSON); tokens are counted as one per four
characters, and it costs nothing. Everything it answers is labeled provider ``offline``.
"""

from __future__ import annotations

import json
import math

from lantern.models.records import ModelRequest, ModelResponse, TokenUsage

PREFIX = "offline/"
MODELS = frozenset({"offline/echo"})


def tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


class OfflineProvider:
    name = "offline"

    async def aclose(self) -> None:
        pass

    async def complete(self, request: ModelRequest) -> ModelResponse:
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
        seen = "".join([request.system or "", *(m.content for m in request.messages)])
        return ModelResponse(
            text=text,
            model=request.model,
            provider=self.name,
            usage=TokenUsage(tokens(seen), tokens(text)),
        )
