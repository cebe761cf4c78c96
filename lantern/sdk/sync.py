"""``Client``: the blocking face of ``AsyncClient``, and nothing more.

Each ``Client`` owns a private event loop running in a daemon thread; every method hands the
``AsyncClient`` coroutine of the same name to that loop and blocks until it is done. Iterators
(``iter_runs``, ``iter_agents``, ``follow``, ``stream``) become plain generators. All logic lives in
``client.py``: a method here is one line.

Because the loop is private, a ``Client`` also works from a thread whose own event loop is
running (inside ``async def``), though it blocks that loop for the duration of each call: prefer
``AsyncClient`` there. The one thing that cannot work is calling it from its own loop's thread
(that would wait on itself forever); that raises ``UsageError`` instead of hanging.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

from lantern.errors import UsageError
from lantern.sdk.client import AsyncClient, Decision
from lantern.sdk.models import (
    Agent,
    Delivery,
    Event,
    Page,
    PendingApproval,
    Receipt,
    Run,
    RunStatus,
    Worker,
)
from lantern.sdk.stream import StreamItem

T = TypeVar("T")


class LoopThread:
    """An event loop running forever in a daemon thread, to run coroutines from other threads."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="lantern-sdk", daemon=True
        )
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise UsageError("a lantern.Client cannot be called from its own event loop's thread")
        if self.loop.is_closed():
            coro.close()
            raise UsageError("this lantern.Client is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. a KeyboardInterrupt: do not leave the request running
            raise

    def iterate(self, source: AsyncIterator[T]) -> Iterator[T]:
        """A generator over an async iterator whose steps run on the loop."""
        try:
            while True:
                try:
                    item = self.run(_next(source))
                except StopAsyncIteration:
                    return
                yield item
        finally:
            close = getattr(source, "aclose", None)
            if close is not None and not self.loop.is_closed():
                self.run(close())

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        if threading.current_thread() is self.thread:
            self.loop.call_soon(self.loop.stop)  # collected on the loop itself: just stop it
            return
        asyncio.run_coroutine_threadsafe(self.loop.shutdown_asyncgens(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


async def _next(source: AsyncIterator[T]) -> T:
    return await anext(source)


class Client:
    """A blocking Lantern client: the methods of ``AsyncClient``, called without ``await``.

    ``with lantern.Client() as client: run = client.wait(client.create_run("onboard").id)``
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
    ) -> None:
        self._async = AsyncClient(base_url, api_key, timeout=timeout, max_retries=max_retries)
        self._thread = LoopThread()
        self._finalizer = weakref.finalize(self, self._thread.stop)

    @property
    def base_url(self) -> str:
        return self._async.base_url

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._finalizer.alive:
            try:
                self._thread.run(self._async.aclose())
            finally:
                self._finalizer()

    def create_run(
        self,
        agent_name: str,
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        wait: float | None = None,
        priority: int | None = None,
    ) -> Run:
        return self._thread.run(
            self._async.create_run(
                agent_name, input, idempotency_key=idempotency_key, wait=wait, priority=priority
            )
        )

    def get_run(self, run_id: str, *, wait: float | None = None) -> Run:
        return self._thread.run(self._async.get_run(run_id, wait=wait))

    def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        agent_name: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[Run]:
        return self._thread.run(
            self._async.list_runs(status=status, agent_name=agent_name, limit=limit, cursor=cursor)
        )

    def iter_runs(
        self,
        *,
        status: RunStatus | None = None,
        agent_name: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Iterator[Run]:
        return self._thread.iterate(
            self._async.iter_runs(status=status, agent_name=agent_name, limit=limit, cursor=cursor)
        )

    def events(
        self,
        run_id: str,
        *,
        after: int = 0,
        limit: int | None = None,
        expand_outputs: bool = False,
    ) -> list[Event]:
        return self._thread.run(
            self._async.events(run_id, after=after, limit=limit, expand_outputs=expand_outputs)
        )

    def blob(self, run_id: str, ref: str) -> Any:
        return self._thread.run(self._async.blob(run_id, ref))

    def deliveries(self, run_id: str) -> list[Delivery]:
        return self._thread.run(self._async.deliveries(run_id))

    def follow(self, run_id: str, *, after: int = 0, poll: float = 0.5) -> Iterator[Event]:
        return self._thread.iterate(self._async.follow(run_id, after=after, poll=poll))

    def stream(self, run_id: str, *, after: int = 0) -> Iterator[StreamItem]:
        return self._thread.iterate(self._async.stream(run_id, after=after))

    def wait(self, run_id: str, *, timeout: float | None = None) -> Run:
        return self._thread.run(self._async.wait(run_id, timeout=timeout))

    def approve(
        self,
        run_id: str,
        node_id: str,
        decision: Decision = "approve",
        comment: str | None = None,
    ) -> dict[str, Any]:
        return self._thread.run(self._async.approve(run_id, node_id, decision, comment))

    def signal(
        self,
        run_id: str,
        name: str,
        payload: Any = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        return self._thread.run(self._async.signal(run_id, name, payload, idempotency_key))

    def cancel(self, run_id: str) -> Run:
        return self._thread.run(self._async.cancel(run_id))

    def secrets(self) -> list[dict[str, Any]]:
        return self._thread.run(self._async.secrets())

    def set_secret(self, name: str, value: str) -> dict[str, Any]:
        return self._thread.run(self._async.set_secret(name, value))

    def delete_secret(self, name: str) -> None:
        return self._thread.run(self._async.delete_secret(name))

    def put_schedule(self, name: str, definition: Mapping[str, Any]) -> dict[str, Any]:
        return self._thread.run(self._async.put_schedule(name, definition))

    def schedules(self) -> list[dict[str, Any]]:
        return self._thread.run(self._async.schedules())

    def schedule(self, name: str) -> dict[str, Any]:
        return self._thread.run(self._async.schedule(name))

    def delete_schedule(self, name: str) -> None:
        return self._thread.run(self._async.delete_schedule(name))

    def trigger_schedule(self, name: str) -> Run:
        return self._thread.run(self._async.trigger_schedule(name))

    def limits(self) -> list[dict[str, Any]]:
        return self._thread.run(self._async.limits())

    def put_limit(self, name: str, definition: Mapping[str, Any]) -> dict[str, Any]:
        return self._thread.run(self._async.put_limit(name, definition))

    def delete_limit(self, name: str, *, server: bool = False) -> None:
        return self._thread.run(self._async.delete_limit(name, server=server))

    def runtime_nodes(self) -> list[dict[str, Any]]:
        return self._thread.run(self._async.runtime_nodes())

    def vms(self, run_id: str) -> list[dict[str, Any]]:
        return self._thread.run(self._async.vms(run_id))

    def pending_approvals(self, *, limit: int | None = None) -> list[PendingApproval]:
        return self._thread.run(self._async.pending_approvals(limit=limit))

    def retry(self, run_id: str, *, from_step: str | None = None) -> Run:
        return self._thread.run(self._async.retry(run_id, from_step=from_step))

    def resume(self, run_id: str, version: str) -> Run:
        return self._thread.run(self._async.resume(run_id, version))

    def receipt(self, run_id: str) -> Receipt:
        return self._thread.run(self._async.receipt(run_id))

    def receipt_keys(self) -> list[dict[str, Any]]:
        return self._thread.run(self._async.receipt_keys())

    def apply_agent(self, definition: Mapping[str, Any]) -> Agent:
        return self._thread.run(self._async.apply_agent(definition))

    def get_agent(self, name: str, *, version: int | None = None) -> Agent:
        return self._thread.run(self._async.get_agent(name, version=version))

    def list_agents(self, *, limit: int | None = None, cursor: str | None = None) -> Page[Agent]:
        return self._thread.run(self._async.list_agents(limit=limit, cursor=cursor))

    def iter_agents(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> Iterator[Agent]:
        return self._thread.iterate(self._async.iter_agents(limit=limit, cursor=cursor))

    def workers(self) -> list[Worker]:
        return self._thread.run(self._async.workers())

    def health(self) -> bool:
        return self._thread.run(self._async.health())
