"""Streaming providers: the OpenAI and Anthropic SDKs streaming from the fake provider over
real HTTP (both wire formats), and the offline provider streaming its words. A streamed
answer is the same answer: text, tool calls, usage and the Idempotency-Key as without."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from lantern.errors import StepError
from lantern.models.anthropic import AnthropicProvider
from lantern.models.offline import OfflineProvider
from lantern.models.openai import OpenAIProvider
from lantern.models.records import Message, ModelRequest, Provider, ToolSpec
from tests.fake_llm import FakeProvider, Script

PROVIDERS: dict[str, Callable[[], Provider]] = {
    "openai": OpenAIProvider,
    "anthropic": AnthropicProvider,
}
LOOKUP = ToolSpec("crm_lookup", "Find a customer.", {"type": "object", "properties": {}})


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProvider]:
    provider = FakeProvider(script=Script(["Hello there, Ada Lovelace."])).start()
    for name, value in provider.env().items():
        monkeypatch.setenv(name, value)
    yield provider
    provider.close()


def request(key: str, model: str = "gpt-4o-mini", **kw: object) -> ModelRequest:
    return ModelRequest(model, (Message("user", "Greet Ada"),), key, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_streamed_answer_arrives_in_pieces_and_equals_the_plain_one(
    fake: FakeProvider, api: str
) -> None:
    provider: Provider = PROVIDERS[api]()
    try:
        pieces: list[str] = []
        streamed = await provider.complete(request("k-stream"), pieces.append)
        plain = await provider.complete(request("k-plain"))
    finally:
        await provider.aclose()
    assert pieces == ["Hello ", "there, ", "Ada ", "Lovelace."]
    assert streamed == plain
    assert streamed.text == "Hello there, Ada Lovelace."
    assert (streamed.usage.input_tokens, streamed.usage.output_tokens) == (10, 5)
    first, second = fake.calls()
    assert first.body["stream"] is True and "stream" not in second.body
    assert (first.key, second.key) == ("k-stream", "k-plain")


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_streamed_tool_calls_are_assembled_from_their_pieces(
    fake: FakeProvider, api: str
) -> None:
    fake.script = Script([[("crm_lookup", {"id": "c-42", "deep": {"n": [1, 2]}})]])
    provider: Provider = PROVIDERS[api]()
    try:
        pieces: list[str] = []
        answer = await provider.complete(request("k-tools", tools=(LOOKUP,)), pieces.append)
    finally:
        await provider.aclose()
    assert pieces == []
    (call,) = answer.tool_calls
    assert call.name == "crm_lookup"
    assert dict(call.arguments) == {"id": "c-42", "deep": {"n": [1, 2]}}
    assert call.id


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_an_answer_cut_off_mid_stream_is_a_retryable_llm_failure(
    fake: FakeProvider, api: str
) -> None:
    fake.cut("gpt-4o-mini", 2)
    provider: Provider = PROVIDERS[api]()
    try:
        pieces: list[str] = []
        with pytest.raises(StepError) as failed:
            await provider.complete(request("k-cut"), pieces.append)
    finally:
        await provider.aclose()
    assert pieces == ["Hello ", "there, "]
    assert (failed.value.error_class, failed.value.retryable) == ("llm", True)


async def test_the_offline_provider_streams_its_words() -> None:
    pieces: list[str] = []
    streamed = await OfflineProvider(0.0).complete(
        ModelRequest("offline/echo", (Message("user", "one two  three"),), "k"), pieces.append
    )
    assert pieces == ["one ", "two  ", "three"]
    assert streamed.text == "one two  three"
