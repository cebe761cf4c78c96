"""A new code run's opening (``FunctionDrive.begin``), on both backends.

The function runs up to its first ``ctx`` call while the lease is being won (at most
``OPENING_PATIENCE``), so its first ``step_started`` goes in the transaction that leases the
run and journals ``run_started``. These tests pin what happens at the edges of that: the
first call never comes within the window, never comes at all, or the function raises first;
two replicas race to start the run; a cancel lands while the opening is in flight; the lease
is lost once the function is under way; the opening's answer is lost.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import lantern
from lantern.engine.cancel import cancel_run
from lantern.engine.functions import OPENING_PATIENCE
from lantern.engine.runs import create_run
from lantern.engine.worker import Worker
from lantern.errors import StoreUnavailable
from lantern.store import Store, open_store
from lantern.store.records import Run

Writes = list[list[tuple[str, str | None]]]


def counted(store: Store, monkeypatch: pytest.MonkeyPatch) -> Writes:
    """Every transaction that writes the journal, as (kind, step) lists, in order."""
    writes: Writes = []
    append, start_run = store.append, store.start_run

    async def counted_append(batch: Any) -> None:
        writes.append([(e.kind, e.step_id) for e in batch.events])
        await append(batch)

    async def counted_start(run_id: str, worker: str, ttl: float, events: Any, update: Any) -> Any:
        writes.append([(e.kind, e.step_id) for e in events])
        return await start_run(run_id, worker, ttl, events, update)

    monkeypatch.setattr(store, "append", counted_append)
    monkeypatch.setattr(store, "start_run", counted_start)
    return writes


async def drive(store: Store, app: lantern.App, run_id: str, worker: str = "w1") -> Run | None:
    """A drive with no lease won before: a queued run is opened by ``begin``."""
    async with Worker(store, app, worker_id=worker, lease_ttl=60) as w:
        assert w.runner is not None
        return await w.runner.drive(run_id)


async def kinds(store: Store, run_id: str) -> list[tuple[str, str | None]]:
    return [(e.kind, e.step_id) for e in await store.events(run_id)]


def stepper(calls: list[str]) -> Any:
    async def work(label: str) -> str:
        calls.append(label)
        return label.upper()

    return work


@pytest.mark.parametrize("blocking", [False, True], ids=["async", "def"])
async def test_a_first_step_after_the_window_opens_the_run_on_its_own(
    store: Store, monkeypatch: pytest.MonkeyPatch, blocking: bool
) -> None:
    """Code that takes longer than the window before its first ctx call (an await of
    something else, or work that holds its thread) gets the run opened without it."""
    app = lantern.App()
    calls: list[str] = []
    work = stepper(calls)
    late = OPENING_PATIENCE * 3

    if blocking:

        @app.agent("late")
        def late_def(ctx: Any) -> Any:
            time.sleep(late)
            return ctx.step("a", work, "a")
    else:

        @app.agent("late")
        async def late_async(ctx: lantern.Context) -> Any:
            await asyncio.sleep(late)
            return await ctx.step("a", work, "a")

    run = await create_run(store, "late", None, app=app)
    writes = counted(store, monkeypatch)
    done = await drive(store, app, run.id)
    assert done is not None and done.status == "succeeded" and done.output == "A", done
    assert calls == ["a"]
    # The opening alone once the window is over, then the step's start on its own.
    assert writes[:2] == [[("run_started", None)], [("step_started", "a")]]
    assert [w for batch in writes[2:] for w in batch] == [
        ("step_completed", "a"),
        ("run_succeeded", None),
    ]


async def test_a_function_that_returns_without_a_ctx_call_succeeds(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = lantern.App()

    @app.agent("pure")
    async def pure(ctx: lantern.Context, n: int) -> dict[str, int]:
        return {"double": n * 2}

    run = await create_run(store, "pure", {"n": 21}, app=app)
    writes = counted(store, monkeypatch)
    done = await drive(store, app, run.id)
    assert done is not None and done.status == "succeeded" and done.output == {"double": 42}
    assert writes == [[("run_started", None)], [("run_succeeded", None)]]


@pytest.mark.parametrize("wait", [0, OPENING_PATIENCE * 3], ids=["at-once", "after-the-window"])
async def test_a_function_that_raises_before_a_ctx_call_fails_the_run(
    store: Store, wait: float
) -> None:
    app = lantern.App()

    @app.agent("broken")
    async def broken(ctx: lantern.Context) -> None:
        await asyncio.sleep(wait)
        raise ValueError("no config")

    run = await create_run(store, "broken", None, app=app)
    done = await drive(store, app, run.id)
    assert done is not None and done.status == "failed"
    assert done.error == {
        "code": "function_error",
        "type": "ValueError",
        "message": "ValueError: no config",
    }
    assert await kinds(store, run.id) == [("run_started", None), ("run_failed", None)]


@pytest.fixture
async def replica_store(database_url: str) -> AsyncIterator[Store]:
    """A second replica's connection to the same database."""
    s = open_store(database_url)
    await s.open()
    yield s
    await s.close()


@pytest.mark.parametrize("blocking", [False, True], ids=["async", "def"])
async def test_two_replicas_starting_one_run_run_its_steps_once(
    store: Store, replica_store: Store, monkeypatch: pytest.MonkeyPatch, blocking: bool
) -> None:
    """Both replicas run the function up to its first ctx call and try to start the run at
    once. One wins: its function runs the steps. The other's function is stopped at that
    first call: it performs nothing through ctx and no task of it is left running."""
    app = lantern.App()
    calls: list[str] = []
    work = stepper(calls)
    outcomes: list[str] = []
    ended = threading.Semaphore(0)

    if blocking:

        @app.agent("race")
        def race_def(ctx: Any) -> Any:
            try:
                first = ctx.step("a", work, "a")
                outcomes.append("ran")
                return [first, ctx.step("b", work, "b")]
            except BaseException as exc:
                outcomes.append(type(exc).__name__)
                raise
            finally:
                ended.release()
    else:

        @app.agent("race")
        async def race_async(ctx: lantern.Context) -> Any:
            try:
                first = await ctx.step("a", work, "a")
                outcomes.append("ran")
                return [first, await ctx.step("b", work, "b")]
            except BaseException as exc:
                outcomes.append(type(exc).__name__)
                raise
            finally:
                ended.release()

    run = await create_run(store, "race", None, app=app)
    arrived: list[str] = []
    both = asyncio.Event()

    def gated(s: Store) -> None:
        start_run = s.start_run

        async def start_when_both_try(
            run_id: str, worker: str, ttl: float, events: Any, update: Any
        ) -> Any:
            arrived.append(worker)
            if len(arrived) == 2:
                both.set()
            await asyncio.wait_for(both.wait(), 10)
            return await start_run(run_id, worker, ttl, events, update)

        monkeypatch.setattr(s, "start_run", start_when_both_try)

    gated(store)
    gated(replica_store)
    results = await asyncio.gather(
        drive(store, app, run.id, "w1"), drive(replica_store, app, run.id, "w2")
    )
    assert sorted(arrived) == ["w1", "w2"]
    assert all(ended.acquire(timeout=10) for _ in range(2)), "a function was left running"
    # The loser's drive ends with nothing (the run held elsewhere) or the finished run.
    assert [r.status for r in results if r is not None] in (["succeeded"], ["succeeded"] * 2)
    finished = await store.get_run(run.id)
    assert finished is not None and finished.output == ["A", "B"]
    assert calls == ["a", "b"]  # each step once, by the winner
    stopped = "CancelledError"
    assert sorted(outcomes) == sorted(["ran", stopped]), outcomes
    assert await kinds(store, run.id) == [
        ("run_started", None),
        ("step_started", "a"),
        ("step_completed", "a"),
        ("step_started", "b"),
        ("step_completed", "b"),
        ("run_succeeded", None),
    ]
    if not blocking:
        left = [t for t in asyncio.all_tasks() if "race_async" in repr(t.get_coro())]
        assert left == []


async def test_a_cancel_flagged_before_the_drive_never_calls_the_function(store: Store) -> None:
    app = lantern.App()
    called: list[str] = []

    @app.agent("never")
    async def never(ctx: lantern.Context) -> None:
        called.append("function")

    run = await create_run(store, "never", None, app=app)
    assert await store.request_cancel(run.id)
    done = await drive(store, app, run.id)
    assert done is not None and done.status == "cancelled"
    assert called == []
    assert await kinds(store, run.id) == [("run_cancelled", None)]


async def test_a_cancel_that_lands_while_the_opening_is_in_flight_runs_no_step(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run was read queued and not cancelled; the function reached its first ctx call;
    the cancel (from another replica) finishes the run before the opening lands. The opening
    is refused, the function stopped, and its step never runs."""
    app = lantern.App()
    calls: list[str] = []
    work = stepper(calls)

    @app.agent("doomed")
    async def doomed(ctx: lantern.Context) -> Any:
        return await ctx.step("a", work, "a")

    run = await create_run(store, "doomed", None, app=app)
    start_run = store.start_run

    async def cancelled_first(
        run_id: str, worker: str, ttl: float, events: Any, update: Any
    ) -> Any:
        await cancel_run(store, run_id, "api", 60)
        return await start_run(run_id, worker, ttl, events, update)

    monkeypatch.setattr(store, "start_run", cancelled_first)
    done = await drive(store, app, run.id)
    assert done is not None and done.status == "cancelled"
    assert calls == []
    assert await kinds(store, run.id) == [("run_cancelled", None)]


async def test_a_lease_lost_mid_way_stops_the_function_before_its_next_step(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run was opened by ``begin``; while its first step runs, its renewals stop reaching
    the database and another replica takes the expired lease. The function goes no further:
    its next step is not invoked and nothing more is journaled under the old lease."""
    app = lantern.App()
    calls: list[str] = []
    inside, release = asyncio.Event(), asyncio.Event()

    async def slow() -> str:
        inside.set()
        await release.wait()
        return "slow"

    async def after() -> str:
        calls.append("after")
        return "after"

    @app.agent("stolen")
    async def stolen(ctx: lantern.Context) -> Any:
        return [await ctx.step("slow", slow), await ctx.step("after", after)]

    run = await create_run(store, "stolen", None, app=app)
    ttl = 0.6
    renew = store.renew_leases
    cut = asyncio.Event()

    async def renew_unless_cut(leases: Any, ttl: float) -> set[str]:
        if cut.is_set():
            return set()  # as if this replica's renewals never reached the database
        return await renew(leases, ttl)

    monkeypatch.setattr(store, "renew_leases", renew_unless_cut)
    async with Worker(store, app, worker_id="w1", lease_ttl=ttl) as w:
        assert w.runner is not None
        task = asyncio.ensure_future(w.runner.drive(run.id))
        await asyncio.wait_for(inside.wait(), 10)
        cut.set()
        thief = None
        async with asyncio.timeout(10):
            while thief is None:
                await asyncio.sleep(0.05)  # until the lease has expired
                thief = await store.acquire_lease(run.id, "w2", 60, reclaim=False)
        release.set()
        result = await asyncio.wait_for(task, 10)
    assert result is None  # another worker holds the run now
    assert calls == []
    assert await kinds(store, run.id) == [("run_started", None), ("step_started", "slow")]


@pytest.mark.parametrize("landed", [False, True], ids=["not-landed", "landed"])
async def test_an_opening_whose_answer_is_lost_runs_each_step_once(
    store: Store, monkeypatch: pytest.MonkeyPatch, landed: bool
) -> None:
    """The opening's transaction fails, or lands with its answer lost: the drive tries again
    (a new function, from the top) and each step still runs once."""
    app = lantern.App()
    calls: list[str] = []
    work = stepper(calls)

    @app.agent("blink")
    async def blink(ctx: lantern.Context) -> Any:
        return [await ctx.step("a", work, "a"), await ctx.step("b", work, "b")]

    run = await create_run(store, "blink", None, app=app)
    start_run = store.start_run
    failures: list[str] = []

    async def blinking(run_id: str, worker: str, ttl: float, events: Any, update: Any) -> Any:
        if not failures:
            failures.append(worker)
            if landed:
                await start_run(run_id, worker, ttl, events, update)
            raise StoreUnavailable("connection lost")
        return await start_run(run_id, worker, ttl, events, update)

    monkeypatch.setattr(store, "start_run", blinking)
    done = await drive(store, app, run.id)
    assert failures == ["w1"]
    assert done is not None and done.status == "succeeded" and done.output == ["A", "B"]
    assert calls == ["a", "b"]
    journal = [k for k, _ in await kinds(store, run.id)]
    assert journal.count("run_started") == 1
    assert journal.count("step_started") == 2 and journal.count("step_completed") == 2
    assert ("run_recovered" in journal) == landed


async def test_a_cancel_on_the_replica_opening_the_run_finishes_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel made on the very replica that is opening the queued run (its API, the same
    worker id) takes the free lease to journal the cancellation; the opening then tries to
    lease the run. A replica takes back a lease that names its own id (its runs after a
    restart), but not this one: the cancel goes through, and the function's step never runs.
    It used to be taken from under the cancel, whose commit was refused (a 500 at the API)
    while the run went on to succeed."""
    app = lantern.App()
    calls: list[str] = []
    work = stepper(calls)

    @app.agent("doomed")
    async def doomed(ctx: lantern.Context) -> Any:
        return await ctx.step("a", work, "a")

    run = await create_run(store, "doomed", None, app=app)
    start_run, events = store.start_run, store.events
    leased, tried = asyncio.Event(), asyncio.Event()

    async def start_once_the_cancel_holds_the_lease(
        run_id: str, worker: str, ttl: float, opening: Any, update: Any
    ) -> Any:
        await asyncio.wait_for(leased.wait(), 10)
        try:
            return await start_run(run_id, worker, ttl, opening, update)
        finally:
            tried.set()

    async def read_once_the_opening_was_tried(run_id: str, **kw: Any) -> Any:
        leased.set()  # the cancel holds the lease and reads the journal next
        await asyncio.wait_for(tried.wait(), 10)
        return await events(run_id, **kw)

    monkeypatch.setattr(store, "start_run", start_once_the_cancel_holds_the_lease)
    monkeypatch.setattr(store, "events", read_once_the_opening_was_tried)
    cancelling = asyncio.ensure_future(cancel_run(store, run.id, "w1", 60))
    driving = asyncio.ensure_future(drive(store, app, run.id, "w1"))
    cancelled, _ = await asyncio.gather(cancelling, driving)
    monkeypatch.setattr(store, "events", events)
    assert cancelled.status == "cancelled"
    assert calls == []
    assert await kinds(store, run.id) == [("run_cancelled", None)]
