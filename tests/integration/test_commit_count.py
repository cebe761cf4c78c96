"""What one code-first step costs the database: its transactions must not grow.

A step's cost is counted where the store meets the database (SQLite: each ``_write`` and
``_read``, one transaction each; PostgreSQL: each journal write on the writer connection and
each pooled connection lent out, one or more statements in autocommit or one transaction), so
it counts every round trip a step adds however the engine reaches the store. The marginal
count of one step is (a 10-step run's - a 1-step run's) / 9, which takes the run's own opening
and closing out. The bounds are what a step costs today; a change that adds a round trip per
step fails here and must say why in its commit (and lower nothing else to pass).

Only code-first runs are counted here; a graph step's commits are bench/steps.py's (it reports
appends per transaction), and a plain agent's turns and a microVM's steps go through the same
fenced commit (``lantern.engine.commits``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import lantern
from lantern.engine.runs import create_run
from lantern.engine.worker import Worker
from lantern.store import Run, Store

STEPS = 10
# A code-first step today: one journal commit (its step_completed with the next step's start
# rides in it) and no other round trip (on PostgreSQL a NOTIFY per commit made it 1.11 until a
# lone replica stopped sending them); bounds per step, marginal.
MAX_WRITES_PER_STEP = 1.0
MAX_OTHERS_PER_STEP = 0.0


looking: ContextVar[bool] = ContextVar("looking", default=False)


@dataclass
class Counts:
    writes: int = 0  # SQLite: write transactions; PostgreSQL: journal writes
    others: int = 0  # SQLite: read transactions; PostgreSQL: pooled connections lent


def count_round_trips(store: Store) -> Counts:
    """Wrap this store's database primitives (on the instance) to count what they are lent."""
    counts = Counts()
    target: Any = store
    if not hasattr(target, "_writer_execute"):  # SQLite: a transaction per call, on its thread
        write: Callable[..., Awaitable[Any]] = target._write
        read: Callable[..., Awaitable[Any]] = target._read

        async def counted_write(fn: Any) -> Any:
            counts.writes += 1
            return await write(fn)

        async def counted_read(fn: Any) -> Any:
            counts.others += 1
            return await read(fn)

        target._write, target._read = counted_write, counted_read
    else:  # PostgreSQL: journal writes on one connection, everything else through the pool
        execute: Callable[..., Awaitable[Any]] = target._writer_execute
        connection: Callable[[], AbstractAsyncContextManager[Any]] = target._connection

        async def counted_execute(sql: str, params: Any) -> Any:
            counts.writes += 1
            return await execute(sql, params)

        @asynccontextmanager
        async def counted_connection() -> AsyncIterator[Any]:
            if not looking.get():
                counts.others += 1  # reads, and the writes that are not journal appends
            async with connection() as conn:
                yield conn

        target._writer_execute, target._connection = counted_execute, counted_connection
        # The relay's look for listening peers is made every half second while commits flow,
        # not per step (a slow step would meet one in every run): it is not counted. Its
        # NOTIFYs are.
        relay = target._relay
        look: Callable[..., Awaitable[Any]] = relay._execute

        async def uncounted_look(sql: str, args: Any) -> Any:
            if "pg_stat_activity" not in sql:
                return await look(sql, args)
            token = looking.set(True)
            try:
                return await look(sql, args)
            finally:
                looking.reset(token)

        relay._execute = uncounted_look
    return counts


async def test_a_code_first_step_costs_no_more_commits_than_today(store: Store) -> None:
    app = lantern.App()

    async def noop() -> None:
        return None

    @app.agent("steps")
    async def steps(ctx: lantern.Context, n: int) -> None:
        for k in range(n):
            await ctx.step(f"s{k}", noop)

    async with Worker(store, app, worker_id="w1", lease_ttl=60) as worker:
        assert worker.runner is not None
        runner = worker.runner
        counts = count_round_trips(store)

        async def cost(n: int) -> tuple[int, int]:
            run = await create_run(store, "steps", {"n": n}, app=app)
            before = (counts.writes, counts.others)
            done = await runner.drive(run.id)
            assert done is not None and done.status == "succeeded", done
            return counts.writes - before[0], counts.others - before[1]

        await cost(1)  # the first drive of an agent reads its definition once
        # The least of three each: a lease renewal or another background write of the worker
        # may land in one measurement on a loaded machine, never in every one.
        ones = [await cost(1) for _ in range(3)]
        tens = [await cost(STEPS) for _ in range(3)]
        one = (min(c[0] for c in ones), min(c[1] for c in ones))
        ten = (min(c[0] for c in tens), min(c[1] for c in tens))

    writes = (ten[0] - one[0]) / (STEPS - 1)
    others = (ten[1] - one[1]) / (STEPS - 1)
    assert writes <= MAX_WRITES_PER_STEP, (one, ten)
    assert others <= MAX_OTHERS_PER_STEP, (one, ten)
    assert one[0] >= 1  # the counter sees the store's writes at all


async def test_a_run_its_replica_drives_at_once_is_stored_with_its_opening(store: Store) -> None:
    """``POST /v1/runs?wait=`` on a replica with a free slot (``Worker.start_new``): the run
    is stored with its lease and opening in one transaction, a round trip (and on SQLite an
    fsync) fewer than a create followed by the drive's opening. Code-first here; a graph's
    and a plain agent's opening go through the same ``Drive.begin`` (both backends: the store's
    ``start_new_run`` conformance test)."""
    app = lantern.App()

    async def noop() -> None:
        return None

    @app.agent("steps")
    async def steps(ctx: lantern.Context, n: int) -> None:
        for k in range(n):
            await ctx.step(f"s{k}", noop)

    async with Worker(store, app, worker_id="w1", lease_ttl=60) as worker:
        assert worker.runner is not None
        runner = worker.runner
        counts = count_round_trips(store)

        async def queued_then_opened() -> int:
            before = counts.writes + counts.others
            run = await create_run(store, "steps", {"n": 1}, app=app)
            done = await runner.drive(run.id, known=run)
            assert done is not None and done.status == "succeeded", done
            return counts.writes + counts.others - before

        async def stored_opened() -> int:
            before = counts.writes + counts.others
            run = await create_run(store, "steps", {"n": 1}, app=app, start=worker.start_new)
            assert run.status == "running"  # stored started: no queued run in between
            (drive,) = [t for t in worker._runs if t.get_name() == f"drive {run.id}"]
            done = await drive
            assert isinstance(done, Run) and done.status == "succeeded", done
            return counts.writes + counts.others - before

        await queued_then_opened()  # the first drive of an agent reads its definition once
        # The least of three each, as above.
        separate = min([await queued_then_opened() for _ in range(3)])
        together = min([await stored_opened() for _ in range(3)])
    assert together <= separate - 1, (separate, together)
