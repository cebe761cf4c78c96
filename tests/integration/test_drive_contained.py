"""Nothing a step or a drive raises leaves a run ``running``, on both backends.

A step whose work raises an exception outside the step error tree (a tool raising one of
Lantern's own non-step errors, a template that fails while the step is prepared: see
tests/hostile/test_secret_templates.py on a real server) fails that step, on a graph run and a
plain agent's run alike; code-first steps already take any exception as the step's failure
(tests/integration/test_functions.py), and a microVM run's steps are reported by its workload.
A drive that dies outside any step ends its run failed (``internal_error``) and gives its
lease back.
"""

from __future__ import annotations

from typing import Any

import pytest

import lantern
from lantern.engine.graph_drive import GraphDrive
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.errors import Conflict
from lantern.store import Store


def make_app() -> lantern.App:
    app = lantern.App()

    @app.tool("clash")
    async def clash(q: str = "") -> dict[str, Any]:
        """Raise one of Lantern's own errors that is no step's."""
        raise Conflict(f"clash over {q!r}")

    return app


GRAPH = {
    "name": "clashing",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "call", "type": "tool", "data": {"tool": "clash", "args": {"q": "x"}}},
        ],
        "edges": [{"source": "start", "target": "call"}],
    },
}
PLAIN = {"name": "clashing-plain", "model": "offline/tools", "tools": ["clash"]}


async def drive(store: Store, definition: dict[str, Any], input: Any) -> Any:
    await apply_agent(store, definition)
    run = await create_run(store, definition["name"], input)
    async with Worker(store, make_app(), worker_id="w1", lease_ttl=60) as w:
        assert w.runner is not None
        await w.runner.drive(run.id)
    found = await store.get_run(run.id)
    assert found is not None
    return found


@pytest.mark.parametrize("definition", [GRAPH, PLAIN], ids=["graph", "plain"])
async def test_a_step_raising_outside_the_error_tree_fails_the_step(
    store: Store, definition: dict[str, Any]
) -> None:
    run = await drive(store, definition, {"q": "x"} if "graph" in definition else "go")
    assert run.status == "failed", run
    assert run.error["code"] == "step_failed"
    assert "Conflict" in run.error["message"] and "clash over" in run.error["message"]
    kinds = [e.kind for e in await store.events(run.id)]
    assert kinds[-2:] == ["step_failed", "run_failed"], kinds


async def test_a_drive_that_dies_fails_its_run_and_gives_its_lease_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: GraphDrive, step: str, attempt: int) -> None:
        raise RuntimeError("a bug in the drive")

    monkeypatch.setattr(GraphDrive, "_spawn", broken)
    run = await drive(store, GRAPH, {})
    assert run.status == "failed", run
    assert run.error["code"] == "internal_error"
    assert "a bug in the drive" in run.error["message"]
    # Nobody holds it: another worker could take it at once.
    assert await store.acquire_lease(run.id, "w2", 60) is not None
