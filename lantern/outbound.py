"""Outbound requests (HTTP connectors and model providers): sized to the replica's concurrency,
queued per host, timed from the moment a request is sent.

A shared connection pool smaller than the number of runs made runs fail for a local reason:
with httpx's default of 100 connections, 300 runs calling a slow peer saw 200 of them wait for
a local connection and fail with ``timeout`` before sending anything. Here each host has its
own queue of ``LANTERN_MAX_CONCURRENT_RUNS`` slots (one slow host cannot starve the others),
the connection pool itself is unbounded (the queues bound it), and a step's timeout starts
only once it holds a slot, so waiting for one never spends it.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx

DEFAULT_PER_HOST = 256  # the default of LANTERN_MAX_CONCURRENT_RUNS
MAX_KEEPALIVE = 1000  # idle connections kept open for reuse, across hosts
POOLS = 16  # connection pools a client spreads its requests over (see Spreading)


class HostQueues:
    """One FIFO of ``per_host`` slots per host (per event loop: tests run several loops)."""

    def __init__(self, per_host: int = DEFAULT_PER_HOST) -> None:
        self.per_host = per_host
        self._loops: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[str, asyncio.Semaphore]
        ] = weakref.WeakKeyDictionary()

    def resize(self, per_host: int) -> None:
        self.per_host = max(1, per_host)
        self._loops = weakref.WeakKeyDictionary()

    def waiting(self, host: str) -> int:
        sem = self._loops.get(asyncio.get_running_loop(), {}).get(host)
        return 0 if sem is None else len(getattr(sem, "_waiters", None) or ())

    @asynccontextmanager
    async def slot(self, host: str) -> AsyncIterator[None]:
        queues = self._loops.setdefault(asyncio.get_running_loop(), {})
        sem = queues.get(host)
        if sem is None:
            sem = queues[host] = asyncio.Semaphore(self.per_host)
        async with sem:
            yield


QUEUES = HostQueues()


def configure(max_concurrent: int) -> None:
    """Size every host's queue to the replica's concurrency (the worker calls this)."""
    QUEUES.resize(max_concurrent)


def host_of(url: str) -> str:
    u = httpx.URL(url)
    return f"{u.scheme}://{u.host}:{u.port or (443 if u.scheme == 'https' else 80)}"


def timeout(seconds: float) -> httpx.Timeout:
    """Per-phase timeouts for a request that already holds its slot: no pool wait counted."""
    return httpx.Timeout(seconds, pool=None)


class Spreading:
    """Requests spread over ``len(pools)`` connection pools, each to the one with the fewest
    requests open (the first, while few are), so no pool holds thousands of connections.

    httpcore's pool walks all its connections, and for each idle one all of them again, every
    time a request is added or removed: with 2,000 runs on one slow peer that bookkeeping was
    three quarters of the replica's CPU (64 million ``is_idle`` calls in a 100 s run), and
    runs queued behind it. Sixteen pools make each walk a sixteenth as long.

    The spreading alone, for httpx's transports (``SpreadTransport``) and for those of the
    httpx copy newer model SDKs use (``lantern.models.transport``); a ``closing`` wraps a
    response body of the library's own kind so the body says when it is closed.
    """

    def __init__(self, pools: Sequence[Any], closing: Callable[[Any, Callable[[], None]], Any]):
        self.pools = list(pools)
        self.open = [0] * len(self.pools)  # requests whose response is not closed yet
        self._closing = closing

    async def handle_async_request(self, request: Any) -> Any:
        index = min(range(len(self.pools)), key=self.open.__getitem__)
        self.open[index] += 1
        try:
            response = await self.pools[index].handle_async_request(request)
        except BaseException:
            self.open[index] -= 1
            raise
        response.stream = self._closing(response.stream, lambda: self._closed(index))
        return response

    def _closed(self, index: int) -> None:
        self.open[index] -= 1

    async def aclose(self) -> None:
        for pool in self.pools:
            await pool.aclose()


class Closing:
    """A response body that says once when it is closed."""

    def __init__(self, stream: Any, done: Callable[[], None]) -> None:
        self._stream = stream
        self._done: Callable[[], None] | None = done

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            if self._done is not None:
                done, self._done = self._done, None
                done()


class _Closing(Closing, httpx.AsyncByteStream):
    def __init__(
        self, stream: httpx.SyncByteStream | httpx.AsyncByteStream, done: Callable[[], None]
    ) -> None:
        assert isinstance(stream, httpx.AsyncByteStream)
        super().__init__(stream, done)


class SpreadTransport(Spreading, httpx.AsyncBaseTransport):
    """httpx's transports, spread (see ``Spreading``)."""

    def __init__(self, pools: Sequence[httpx.AsyncBaseTransport]) -> None:
        super().__init__(pools, _Closing)


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """The process's TLS context for outbound requests: loading the CA bundle takes about
    40 ms, and every pool of every client needs one."""
    return httpx.create_ssl_context()


def spread(make: Callable[[httpx.Limits], httpx.AsyncBaseTransport]) -> SpreadTransport:
    """``POOLS`` transports made by ``make``, sharing the keep-alive allowance; unbounded in
    connections, as the host queues bound them."""
    share = httpx.Limits(max_connections=None, max_keepalive_connections=MAX_KEEPALIVE // POOLS)
    return SpreadTransport([make(share) for _ in range(POOLS)])


def client() -> httpx.AsyncClient:
    transport = spread(lambda share: httpx.AsyncHTTPTransport(verify=ssl_context(), limits=share))
    return httpx.AsyncClient(transport=transport, timeout=timeout(30.0))
