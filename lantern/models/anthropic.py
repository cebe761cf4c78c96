"""Anthropic messages through the official SDK (``ANTHROPIC_BASE_URL`` for another endpoint)."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
from anthropic import AsyncAnthropic

from lantern import outbound
from lantern.errors import StepError
from lantern.models import errors, transport
from lantern.models.clients import PerLoop
from lantern.models.records import (
    Message,
    ModelRequest,
    ModelResponse,
    OnText,
    TokenUsage,
    ToolCall,
)
from lantern.observability.tracing import inject_headers

# What the SDK's HTTP client raises when a streamed body breaks off (the SDK passes it on as
# is): httpx's errors, or those of httpx2, which newer SDKs use.
TRANSPORT_ERRORS: tuple[type[Exception], ...] = (httpx.RequestError,)
try:
    import httpx2

    TRANSPORT_ERRORS += (httpx2.RequestError,)
except ImportError:  # an SDK on httpx
    pass

TIMEOUT_S = 120.0
# The messages API requires max_tokens; this is used when a step gives none.
DEFAULT_MAX_TOKENS = 4096
JSON_INSTRUCTION = "Answer with one JSON object and nothing else."


def _client() -> AsyncAnthropic:
    try:
        # Sized as connectors are (lantern.outbound): no local pool limit, no pool wait, and
        # spread over several pools (lantern.models.transport). Behind a proxy, the SDK's own
        # client: its own httpx (a copy in recent versions), its Limits class, not ours.
        http_client = transport.http_client(
            anthropic.DEFAULT_CONNECTION_LIMITS, socket_options=transport.keepalive_options()
        )
        if http_client is None:
            http_client = anthropic.DefaultAsyncHttpxClient(
                limits=type(anthropic.DEFAULT_CONNECTION_LIMITS)(
                    max_connections=None, max_keepalive_connections=outbound.MAX_KEEPALIVE
                )
            )
        return AsyncAnthropic(
            max_retries=0, timeout=anthropic.Timeout(TIMEOUT_S, pool=None), http_client=http_client
        )
    except anthropic.AnthropicError as exc:
        raise StepError(
            f"anthropic: {exc} (set ANTHROPIC_API_KEY, and ANTHROPIC_BASE_URL for another"
            " endpoint)",
            error_class="llm",
        ) from exc


class AnthropicProvider:
    name = "anthropic"

    def __init__(self) -> None:
        self._clients = PerLoop(_client)

    async def aclose(self) -> None:
        await self._clients.aclose()

    async def complete(self, request: ModelRequest, on_text: OnText | None = None) -> ModelResponse:
        client = self._clients.get()
        headers = {"Idempotency-Key": request.idempotency_key}
        inject_headers(headers)
        kwargs: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens or DEFAULT_MAX_TOKENS,
            "messages": _messages(request.messages),
        }
        # The messages API has no JSON mode: ask in the system prompt, parse the text after.
        system = "\n\n".join(
            s for s in (request.system, JSON_INSTRUCTION if request.json else None) if s
        )
        if system:
            kwargs["system"] = system
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        if request.tools:
            kwargs["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}
                for t in request.tools
            ]
        try:
            if on_text is None:
                answer = await client.messages.create(**kwargs, extra_headers=headers)
            else:
                # The same call streamed: the text handed on as it comes, the final message
                # (tool calls, usage) assembled by the SDK from the events.
                async with client.messages.stream(**kwargs, extra_headers=headers) as stream:
                    async for text in stream.text_stream:
                        on_text(text)
                    answer = await stream.get_final_message()
        except anthropic.APIStatusError as exc:
            raise errors.status_error(
                self.name, request.model, exc.status_code, exc.message, exc.response.headers
            ) from exc
        except anthropic.APIConnectionError as exc:  # timeouts included
            raise errors.connection_error(self.name, request.model, str(exc)) from exc
        except TRANSPORT_ERRORS as exc:  # a stream broken off mid-answer, unwrapped by the SDK
            raise errors.connection_error(self.name, request.model, str(exc)) from exc
        except anthropic.AnthropicError as exc:
            raise errors.bad_answer(self.name, request.model, str(exc)) from exc
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in answer.content:
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                arguments = block.input if isinstance(block.input, dict) else {}
                calls.append(ToolCall(block.id, block.name, arguments))
        return ModelResponse(
            text="".join(texts),
            model=answer.model or request.model,
            provider=self.name,
            usage=TokenUsage(answer.usage.input_tokens, answer.usage.output_tokens),
            tool_calls=tuple(calls),
        )


def _messages(messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    """Anthropic's shape: tool results are user content blocks, one user turn for a batch."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            block = {"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}
            last = out[-1] if out else None
            if last and last["role"] == "user" and isinstance(last["content"], list):
                last["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif m.role == "assistant" and m.tool_calls:
            content: list[dict[str, Any]] = []
            if m.content:
                content.append({"type": "text", "text": m.content})
            content += [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": dict(c.arguments)}
                for c in m.tool_calls
            ]
            out.append({"role": "assistant", "content": content})
        else:
            out.append({"role": m.role, "content": m.content})
    return out
