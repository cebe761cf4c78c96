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
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

DEFAULT_PER_HOST = 256  # the default of LANTERN_MAX_CONCURRENT_RUNS
MAX_KEEPALIVE = 1000  # idle connections kept open for reuse, across hosts


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


def limits() -> httpx.Limits:
    """The connection pool's limits: unbounded, as the host queues bound it."""
    return httpx.Limits(max_connections=None, max_keepalive_connections=MAX_KEEPALIVE)


def timeout(seconds: float) -> httpx.Timeout:
    """Per-phase timeouts for a request that already holds its slot: no pool wait counted."""
    return httpx.Timeout(seconds, pool=None)


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(limits=limits(), timeout=timeout(30.0))
