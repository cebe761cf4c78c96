"""The OpenAI and Anthropic SDK clients send through the spread transport connectors use
(``lantern.outbound``): concurrent calls to one provider are spread over its pools, each pool
is released when its answer is read (streamed or not), and a lone caller keeps to one pool.
The real SDKs, the fake provider over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

from lantern import outbound
from lantern.models.anthropic import AnthropicProvider
from lantern.models.openai import OpenAIProvider
from lantern.models.records import Message, ModelRequest, Provider
from tests.fake_llm import FakeProvider, Script

PROVIDERS: dict[str, Callable[[], Provider]] = {
    "openai": OpenAIProvider,
    "anthropic": AnthropicProvider,
}
AT_ONCE = 2 * outbound.POOLS


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProvider]:
    provider = FakeProvider(script=Script(["Hello there, Ada."])).start()
    for name, value in provider.env().items():
        monkeypatch.setenv(name, value)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield provider
    provider.close()


def request(key: str) -> ModelRequest:
    return ModelRequest("gpt-4o-mini", (Message("user", "Greet Ada"),), key)


def spread_of(provider: Provider) -> outbound.Spreading:
    transport = provider._clients.get()._client._transport  # type: ignore[attr-defined]
    assert isinstance(transport, outbound.Spreading)
    return transport


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_concurrent_calls_are_spread_over_the_pools_and_released(
    fake: FakeProvider, api: str
) -> None:
    provider: Provider = PROVIDERS[api]()
    try:
        spread = spread_of(provider)
        assert len(spread.pools) == outbound.POOLS
        fake.hold()
        calls = [
            asyncio.create_task(
                provider.complete(request(f"k{n}"), None if n % 2 else list[str]().append)
            )
            for n in range(AT_ONCE)
        ]
        for _ in range(1000):  # up to 20 s for all of them to arrive
            if len(fake.calls()) == AT_ONCE:
                break
            await asyncio.sleep(0.02)
        # Every pool holds two requests: none holds them all.
        assert spread.open == [AT_ONCE // outbound.POOLS] * outbound.POOLS
        fake.release()
        answers = await asyncio.gather(*calls)
        assert {a.text for a in answers} == {"Hello there, Ada."}
        assert sorted(r.key or "" for r in fake.calls()) == sorted(f"k{n}" for n in range(AT_ONCE))
        assert spread.open == [0] * outbound.POOLS
        # One call after another: each releases its pool, streamed or not.
        for n in range(3):
            await provider.complete(request(f"again{n}"), list[str]().append if n == 1 else None)
            assert spread.open == [0] * outbound.POOLS
    finally:
        await provider.aclose()


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_behind_a_proxy_the_sdk_keeps_its_own_client(
    fake: FakeProvider, api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client given a transport ignores HTTPS_PROXY; the SDK's own honours it.
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:1")
    provider: Provider = PROVIDERS[api]()
    try:
        transport = provider._clients.get()._client._transport  # type: ignore[attr-defined]
        assert not isinstance(transport, outbound.Spreading)
    finally:
        await provider.aclose()
