"""OpenAI chat completions through the official SDK; any OpenAI-compatible endpoint works
too (vLLM, Ollama, llama.cpp's server) with ``OPENAI_BASE_URL``."""

from __future__ import annotations

import json
from typing import Any

import openai
from openai import AsyncOpenAI

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

TIMEOUT_S = 120.0


def _client() -> AsyncOpenAI:
    try:
        # Sized as connectors are (lantern.outbound): no local pool limit, no pool wait, and
        # spread over several pools (lantern.models.transport). Behind a proxy, the SDK's own
        # client: its own httpx (a copy in recent versions), its Limits class, not ours.
        http_client = transport.http_client(openai.DEFAULT_CONNECTION_LIMITS)
        if http_client is None:
            http_client = openai.DefaultAsyncHttpxClient(
                limits=type(openai.DEFAULT_CONNECTION_LIMITS)(
                    max_connections=None, max_keepalive_connections=outbound.MAX_KEEPALIVE
                )
            )
        return AsyncOpenAI(
            max_retries=0, timeout=openai.Timeout(TIMEOUT_S, pool=None), http_client=http_client
        )
    except openai.OpenAIError as exc:
        raise StepError(
            f"openai: {exc} (set OPENAI_API_KEY, and OPENAI_BASE_URL for another endpoint)",
            error_class="llm",
        ) from exc


class OpenAIProvider:
    name = "openai"

    def __init__(self) -> None:
        self._clients = PerLoop(_client)

    async def aclose(self) -> None:
        await self._clients.aclose()

    async def complete(self, request: ModelRequest, on_text: OnText | None = None) -> ModelResponse:
        client = self._clients.get()
        headers = {"Idempotency-Key": request.idempotency_key}
        inject_headers(headers)
        kwargs: dict[str, Any] = {"model": request.model, "messages": _messages(request)}
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        if request.max_tokens is not None:
            kwargs["max_tokens"] = request.max_tokens
        if request.json:
            kwargs["response_format"] = {"type": "json_object"}
        if request.tools:
            kwargs["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": dict(t.parameters),
                    },
                }
                for t in request.tools
            ]
        try:
            if on_text is not None:
                return await self._streamed(client, request, kwargs, headers, on_text)
            answer = await client.chat.completions.create(**kwargs, extra_headers=headers)
        except openai.APIStatusError as exc:
            raise errors.status_error(
                self.name, request.model, exc.status_code, exc.message, exc.response.headers
            ) from exc
        except openai.APIConnectionError as exc:  # timeouts included
            raise errors.connection_error(self.name, request.model, str(exc)) from exc
        except openai.OpenAIError as exc:  # an answer the SDK could not read
            raise errors.bad_answer(self.name, request.model, str(exc)) from exc
        if not answer.choices:
            raise errors.bad_answer(self.name, request.model, "the answer has no choices")
        message = answer.choices[0].message
        calls = []
        for call in message.tool_calls or ():
            function = getattr(call, "function", None)
            if function is None:
                continue  # a custom (non-function) tool call: Lantern offers none
            calls.append(ToolCall(call.id, function.name, _arguments(function.arguments)))
        usage = answer.usage
        return ModelResponse(
            text=message.content or "",
            model=answer.model or request.model,
            provider=self.name,
            usage=TokenUsage(
                usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0
            ),
            tool_calls=tuple(calls),
        )

    async def _streamed(
        self,
        client: AsyncOpenAI,
        request: ModelRequest,
        kwargs: dict[str, Any],
        headers: dict[str, str],
        on_text: OnText,
    ) -> ModelResponse:
        """The same call streamed: the same key and body (plus ``stream``), the text handed on
        as it comes, tool calls and usage gathered from the chunks."""
        stream = await client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}, extra_headers=headers
        )
        texts: list[str] = []
        calls: dict[int, dict[str, Any]] = {}  # index -> {id, name, arguments pieces}
        model: str | None = None
        usage = TokenUsage()
        chose = False
        async with stream:
            async for chunk in stream:
                model = chunk.model or model
                if chunk.usage is not None:
                    usage = TokenUsage(chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
                for choice in chunk.choices:
                    if choice.index != 0:
                        continue
                    chose = True
                    delta = choice.delta
                    if delta.content:
                        texts.append(delta.content)
                        on_text(delta.content)
                    for call in delta.tool_calls or ():
                        found = calls.setdefault(call.index, {"id": "", "name": "", "args": []})
                        found["id"] = call.id or found["id"]
                        if call.function is not None:
                            found["name"] = call.function.name or found["name"]
                            found["args"].append(call.function.arguments or "")
        if not chose:
            raise errors.bad_answer(self.name, request.model, "the answer has no choices")
        return ModelResponse(
            text="".join(texts),
            model=model or request.model,
            provider=self.name,
            usage=usage,
            tool_calls=tuple(
                ToolCall(c["id"], c["name"], _arguments("".join(c["args"])))
                for _, c in sorted(calls.items())
            ),
        )


def _arguments(raw: str | None) -> dict[str, Any]:
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        # Passed on as is: the tool step reports the bad arguments back to the model.
        return {"_unparsed": raw}
    return value if isinstance(value, dict) else {"_unparsed": raw}


def _messages(request: ModelRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    out += [_message(m) for m in request.messages]
    return out


def _message(m: Message) -> dict[str, Any]:
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
    if m.role == "assistant" and m.tool_calls:
        return {
            "role": "assistant",
            "content": m.content or None,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments))},
                }
                for c in m.tool_calls
            ],
        }
    return {"role": m.role, "content": m.content}
