"""Outbound clients spread their requests over several connection pools (httpcore's pool does
work proportional to its connections for each of them, for every request it adds or removes),
while a lone caller keeps reusing one connection. A real HTTP/1.1 server on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from lantern import outbound
from lantern.effects import egress


class Peer:
    """Answers each request once ``release`` is set; counts connections and requests held."""

    def __init__(self) -> None:
        self.connections = 0
        self.held = 0
        self.release = asyncio.Event()
        self.release.set()
        self.expect = 0
        self.all_held = asyncio.Event()  # ``expect`` requests are held at once

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                self.held += 1
                if self.held == self.expect:
                    self.all_held.set()
                await self.release.wait()
                self.held -= 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def peer() -> AsyncIterator[tuple[Peer, str]]:
    found = Peer()
    server = await asyncio.start_server(found.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield found, f"http://127.0.0.1:{port}"
    server.close()


async def test_a_lone_caller_reuses_one_connection(peer: tuple[Peer, str]) -> None:
    found, url = peer
    async with outbound.client() as client:
        for _ in range(20):
            assert (await client.get(f"{url}/x")).text == "ok"
    assert found.connections == 1


async def test_many_at_once_are_spread_and_every_pool_is_released(
    peer: tuple[Peer, str],
) -> None:
    found, url = peer
    found.release.clear()
    found.expect = 64
    async with egress.client(egress.EgressPolicy.parse("127.0.0.1")) as client:
        transport = client._transport
        assert isinstance(transport, outbound.SpreadTransport)
        calls = [asyncio.create_task(client.get(f"{url}/x")) for _ in range(64)]
        async with asyncio.timeout(10):
            await found.all_held.wait()
        assert transport.open == [64 // outbound.POOLS] * outbound.POOLS
        found.release.set()
        assert [r.status_code for r in await asyncio.gather(*calls)] == [200] * 64
        assert transport.open == [0] * outbound.POOLS
        # A failed request is released too.
        with pytest.raises(httpx.ConnectError):
            await client.get("http://127.0.0.1:1/refused")
        assert transport.open == [0] * outbound.POOLS
