"""Random code-first functions crashed at random points: each step completes exactly once.

A function is a random sequence of groups of steps (a group of one is awaited alone, a bigger
one with ``asyncio.gather``), with names drawn from a few so that repeats (``name#2``) occur.
A crash is a BaseException thrown mid-step or right after a journal commit; like a SIGKILL it
abandons the drive with no clean-up, and everything the dead "process" still does raises it
again. The same worker id then re-drives the run, as many times as it takes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lantern
from lantern.engine.runs import create_run
from lantern.engine.worker import Worker
from lantern.store import NewEvent, Store, open_store


class SimulatedCrash(BaseException):
    """Not an Exception: nothing in the engine may catch it, as nothing survives a SIGKILL."""


groups = st.lists(
    st.lists(st.sampled_from(["fetch", "plan", "mix"]), min_size=1, max_size=3),
    min_size=1,
    max_size=5,
)


@dataclass
class Ledger:
    crash_at: set[int]
    points: int = 0
    dead: bool = False  # the simulated process has crashed: whatever it still does dies too
    invoked: Counter[str] = field(default_factory=Counter)
    keys: dict[str, set[str]] = field(default_factory=dict)
    journaled: set[str] = field(default_factory=set)
    invoked_after_completion: list[str] = field(default_factory=list)

    def point(self) -> None:
        if self.dead:
            raise SimulatedCrash("after the crash")
        self.points += 1
        if self.points in self.crash_at:
            self.dead = True
            raise SimulatedCrash(self.points)


def make_app(plan: list[list[str]], ledger: Ledger | None) -> lantern.App:
    app = lantern.App()

    async def mix(ctx: lantern.Context, previous: Any) -> dict[str, Any]:
        me = ctx.step_id
        if ledger is not None:
            if me in ledger.journaled:
                ledger.invoked_after_completion.append(me)
            ledger.invoked[me] += 1
            ledger.keys.setdefault(me, set()).add(ctx.idempotency_key)
            await asyncio.sleep(0)
            ledger.point()  # crash mid-step: the step ran, its result is lost
        digest = hashlib.sha256(json.dumps([me, previous]).encode()).hexdigest()[:12]
        return {"step": me, "digest": digest}

    @app.agent("random", version="1")
    async def random_function(ctx: lantern.Context) -> list[Any]:
        previous: Any = None
        out: list[Any] = []
        for group in plan:
            if len(group) == 1:
                previous = await ctx.step(group[0], mix, ctx, previous)
                out.append(previous)
            else:
                found = await asyncio.gather(*(ctx.step(n, mix, ctx, previous) for n in group))
                out.append(found)
                previous = found
        return out

    if ledger is not None:

        @app.on_commit
        def after_commit(run_id: str, events: Sequence[NewEvent]) -> None:
            ledger.journaled.update(
                e.step_id for e in events if e.kind == "step_completed" and e.step_id
            )
            ledger.point()  # crash after a commit: the journal has it, the process does not

    return app


async def scenario(url: str, plan: list[list[str]], crash_at: set[int]) -> None:
    store: Store = open_store(url)
    await store.open()
    try:
        clean_app = make_app(plan, None)
        reference = await create_run(store, "random", None, app=clean_app)
        async with Worker(store, clean_app, worker_id="ref", lease_ttl=60) as w:
            assert w.runner is not None
            clean = await w.runner.drive(reference.id)
        assert clean is not None and clean.status == "succeeded", clean and clean.error

        run = await create_run(store, "random", None, app=clean_app)
        ledger = Ledger(crash_at)
        app = make_app(plan, ledger)
        finished = None
        for _ in range(len(crash_at) + 1):
            ledger.dead = False  # a new process
            async with Worker(store, app, worker_id="w1", lease_ttl=60) as w:
                assert w.runner is not None
                try:
                    finished = await w.runner.drive(run.id)
                except SimulatedCrash:
                    continue
            break
        assert finished is not None and finished.status == "succeeded", finished
        events = await store.events(run.id)
        completed = Counter(e.step_id for e in events if e.kind == "step_completed")
        assert set(completed.values()) == {1}  # each step completed exactly once
        assert len(completed) == sum(len(g) for g in plan)
        assert ledger.invoked_after_completion == []  # the replay gate held
        assert all(len(k) == 1 for k in ledger.keys.values())  # one key per step, every time
        assert finished.output == clean.output
    finally:
        await store.close()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=groups, crash_at=st.sets(st.integers(1, 16), max_size=3))
def test_code_first_recovery_after_random_crashes(
    database_url: str, plan: list[list[str]], crash_at: set[int]
) -> None:
    asyncio.run(scenario(database_url, plan, crash_at))
