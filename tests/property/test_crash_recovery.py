"""Random DAGs crashed at random points: recovery runs every step to completion exactly once.

A crash is a BaseException thrown mid-step (inside a tool) or right after a journal commit;
like a SIGKILL it abandons the run with no clean-up and no lease release. The same worker id
then re-drives it, as many times as it takes.
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
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.store import NewEvent, Store, open_store


class SimulatedCrash(BaseException):
    """Not an Exception: nothing in the engine may catch it, as nothing survives a SIGKILL."""


@st.composite
def dags(draw: st.DrawFn) -> list[list[int]]:
    """Predecessor lists: node i (1-based) depends on a non-empty subset of 0..i-1 (0: trigger)."""
    size = draw(st.integers(1, 7))
    return [
        sorted(draw(st.sets(st.integers(0, i - 1), min_size=1, max_size=min(i, 3))))
        for i in range(1, size + 1)
    ]


def definition(name: str, preds: list[list[int]]) -> dict[str, Any]:
    def node(i: int) -> str:
        return "start" if i == 0 else f"n{i}"

    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"}]
    edges: list[dict[str, str]] = []
    for i, ps in enumerate(preds, start=1):
        inputs = {node(p): f"{{{{ steps.{node(p)}.output }}}}" for p in ps}
        nodes.append(
            {
                "id": node(i),
                "type": "tool",
                "data": {"tool": "mix", "args": {"me": node(i), "inputs": inputs}},
            }
        )
        edges += [{"source": node(p), "target": node(i)} for p in ps]
    return {"name": name, "graph": {"nodes": nodes, "edges": edges}}


@dataclass
class Ledger:
    """What the tools and the journal saw, across every crash and re-drive."""

    crash_at: set[int]
    points: int = 0
    invoked: Counter[str] = field(default_factory=Counter)
    keys: dict[str, set[str]] = field(default_factory=dict)
    journaled: set[str] = field(default_factory=set)
    invoked_after_completion: list[str] = field(default_factory=list)

    def point(self) -> None:
        self.points += 1
        if self.points in self.crash_at:
            raise SimulatedCrash(self.points)


def make_app(ledger: Ledger | None) -> lantern.App:
    app = lantern.App()

    @app.tool("mix")
    async def mix(ctx: lantern.ToolContext, me: str, inputs: dict[str, Any]) -> dict[str, Any]:
        if ledger is not None:
            if me in ledger.journaled:
                ledger.invoked_after_completion.append(me)
            ledger.invoked[me] += 1
            ledger.keys.setdefault(me, set()).add(ctx.idempotency_key)
            await asyncio.sleep(0)
            ledger.point()  # crash mid-step: the tool ran, its result is lost
        digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]
        return {"node": me, "digest": digest}

    if ledger is not None:

        @app.on_commit
        def after_commit(run_id: str, events: Sequence[NewEvent]) -> None:
            ledger.journaled.update(
                e.step_id for e in events if e.kind == "step_completed" and e.step_id
            )
            ledger.point()  # crash after a commit: the journal has it, the process does not

    return app


async def scenario(url: str, preds: list[list[int]], crash_at: set[int], name: str) -> None:
    store: Store = open_store(url)
    await store.open()
    try:
        await apply_agent(store, definition(name, preds))
        reference = await create_run(store, name, {"seed": 1})
        async with Worker(store, make_app(None), worker_id="ref", lease_ttl=60) as w:
            assert w.runner is not None
            clean = await w.runner.drive(reference.id)
        assert clean is not None and clean.status == "succeeded"

        run = await create_run(store, name, {"seed": 1})
        ledger = Ledger(crash_at)
        app = make_app(ledger)
        for _ in range(len(crash_at) + 1):
            async with Worker(store, app, worker_id="w1", lease_ttl=60) as w:
                assert w.runner is not None
                try:
                    finished = await w.runner.drive(run.id)
                except SimulatedCrash:
                    continue
            break
        assert finished is not None and finished.status == "succeeded"

        events = await store.events(run.id)
        completed = Counter(e.step_id for e in events if e.kind == "step_completed")
        steps = {"start"} | {f"n{i}" for i in range(1, len(preds) + 1)}
        assert completed == Counter(steps)  # each step completed exactly once
        assert ledger.invoked_after_completion == []  # the replay gate held
        assert all(len(k) == 1 for k in ledger.keys.values())  # one key per step, every time
        assert finished.output == clean.output
        ref_outputs = {
            e.step_id: e.data
            for e in await store.events(reference.id)
            if e.kind == "step_completed"
        }
        assert {e.step_id: e.data for e in events if e.kind == "step_completed"} == ref_outputs
    finally:
        await store.close()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(preds=dags(), crash_at=st.sets(st.integers(1, 14), max_size=3), tag=st.uuids())
def test_recovery_after_random_crashes(
    database_url: str, preds: list[list[int]], crash_at: set[int], tag: object
) -> None:
    asyncio.run(scenario(database_url, preds, crash_at, f"dag-{tag}"))
