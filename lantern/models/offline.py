"""The offline provider (``offline/...`` models): deterministic, no key, no network.

It lets the demo and a first-time user run agents with model steps before any key is set.
``offline/echo`` answers with the last user message (in JSON mode: that message parsed as
JSON, or ``{"text": message}`` when it is not JSON); tokens are counted as one per four
characters, and it costs nothing. Streamed, it sends its answer a word at a time. Everything
it answers is labeled provider ``offline``.
"""

from __future__ import annotations

import asyncio
import json
import math
import re

from lantern.config import offline_word_delay
from lantern.models.records import ModelRequest, ModelResponse, OnText, TokenUsage

PREFIX = "offline/"
MODELS = frozenset({"offline/echo"})


def tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


class OfflineProvider:
    name = "offline"

    async def aclose(self) -> None:
        pass

    def __init__(self, word_delay_s: float | None = None) -> None:
        self.word_delay_s = offline_word_delay() if word_delay_s is None else word_delay_s

    async def complete(self, request: ModelRequest, on_text: OnText | None = None) -> ModelResponse:
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
