"""Group commit: appends that arrive while a write is in flight share the next transaction.

With one writer nothing waits: a lone append is written at once. Under load the appends of
many runs ride in one commit, so the database pays one fsync for all of them. Each caller
still gets its own outcome (its own LeaseLost), because the backend reports one per item.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")

WriteBatch = Callable[[Sequence[T]], Awaitable[Sequence[BaseException | None]]]


class GroupCommitter(Generic[T]):
    def __init__(self, write_batch: WriteBatch[T], *, max_batch: int = 256) -> None:
        self._write_batch = write_batch
        self._max_batch = max_batch
        self._pending: list[tuple[T, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        await fut

    async def _flush(self) -> None:
        while self._pending:
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            try:
                outcomes = await self._write_batch([item for item, _ in batch])
            except BaseException as exc:  # the whole batch failed: every caller hears it
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            for (_, fut), outcome in zip(batch, outcomes, strict=True):
                if fut.done():
                    continue
                if outcome is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(outcome)
