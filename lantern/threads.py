"""The thread pool sync tools run in: bounded, and their own.

A sync tool runs off the event loop, but in asyncio's default executor it would share the
threads DNS lookups (``getaddrinfo``) and other library work use, so a tenant's tool that
blocks could starve every lookup of every run. These threads are the tools' alone, and there
are at most ``LANTERN_TOOL_THREADS`` (default 32) of them: a tool call past that waits its turn.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

DEFAULT_THREADS = 32
_pool: ThreadPoolExecutor | None = None


def _threads() -> int:
    raw = os.environ.get("LANTERN_TOOL_THREADS", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_THREADS


def pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=_threads(), thread_name_prefix="lantern-tool")
    return _pool


async def run_sync(fn: Callable[..., Any], **kwargs: Any) -> Any:
    """``fn(**kwargs)`` on the tools' pool, with the caller's context variables (tracing)."""
    context = contextvars.copy_context()
    call = functools.partial(context.run, fn, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(pool(), call)
