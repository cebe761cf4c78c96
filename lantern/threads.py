"""The thread pool sync tools run in: bounded, and their own.

A sync tool runs off the event loop, but in asyncio's default executor it would share the
threads DNS lookups (``getaddrinfo``) and other library work use, so a tenant's tool that
blocks could starve every lookup of every run. These threads are the tools' alone, and there
are at most ``LANTERN_TOOL_THREADS`` (default 32) of them: a tool call past that waits its turn.
The worker sizes the pool from its settings (``configure``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lantern.config import DEFAULT_TOOL_THREADS

DEFAULT_THREADS = DEFAULT_TOOL_THREADS
_size = DEFAULT_THREADS
_pool: ThreadPoolExecutor | None = None
_pool_size = 0  # the size _pool was made with


def configure(threads: int) -> None:
    """Size the pool (LANTERN_TOOL_THREADS, as the settings give it). A pool of another size
    already made is let go: the calls it runs finish there, new ones go to the new pool."""
    global _size, _pool
    _size = max(1, threads)
    if _pool is not None and _pool_size != _size:
        _pool.shutdown(wait=False)
        _pool = None


def pool() -> ThreadPoolExecutor:
    global _pool, _pool_size
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=_size, thread_name_prefix="lantern-tool")
        _pool_size = _size
    return _pool


async def run_sync(fn: Callable[..., Any], **kwargs: Any) -> Any:
    """``fn(**kwargs)`` on the tools' pool, with the caller's context variables (tracing)."""
    context = contextvars.copy_context()
    call = functools.partial(context.run, fn, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(pool(), call)
