"""An ai-step node: one model call with a templated prompt.

Output: ``{text, json?, model, provider, usage: {inputTokens, outputTokens, costUsd}}``
(and ``route`` when the model was a route). With ``responseFormat: json`` the answer must
parse as JSON, or the step fails (retryable: another attempt may answer well).
"""

from __future__ import annotations

import json
from typing import Any

from lantern.errors import StepError
from lantern.models.call import call
from lantern.models.records import Message, ModelRequest
from lantern.nodes import confidence
from lantern.nodes.base import StepContext


async def execute(ctx: StepContext) -> Any:
    data = ctx.node.data
    prompt = ctx.render("prompt", "")
    system = ctx.render("system")
    wants_json = data.get("responseFormat") == "json"
    request = ModelRequest(
        model=str(data["model"]),
        messages=(Message("user", _text(prompt)),),
        idempotency_key=ctx.idempotency_key,
        system=None if system is None else _text(system),
        temperature=data.get("temperature"),
        max_tokens=data.get("maxTokens"),
        json=wants_json,
    )
    result = await call(ctx.models, request, ctx.gate, on_text=ctx.on_text)
    output = result.output()
    if wants_json:
        try:
            output["json"] = json.loads(_unfenced(result.response.text))
        except ValueError as exc:
            raise StepError(
                f"ai-step {ctx.node.id!r}: model {result.model!r} did not answer JSON ({exc}):"
                f" {result.response.text[:200]!r}",
                error_class="llm",
                retryable=True,
            ) from exc
    if "confidence" in data:
        return await confidence.gate(ctx, _text(prompt), output)
    return output


def _text(value: Any) -> str:
    """A template that is one expression keeps its type: a prompt sends it as JSON text."""
    return value if isinstance(value, str) else json.dumps(value)


def _unfenced(text: str) -> str:
    """Models often wrap JSON in a ```json fence even when asked not to."""
    t = text.strip()
    if t.startswith("```") and t.endswith("```"):
        t = t[3:-3]
        t = t[4:] if t.startswith("json") else t
    return t
