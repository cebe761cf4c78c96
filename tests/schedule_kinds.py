"""A schedule per kind of run (graph, plain, code-first, microVM) for the tests that fire
schedules at real servers, and the checks a user would make of what they fired: every run
completed, and each was created under the key ``schedule|NAME|FIRE_TIME`` of its own fire time.

A server needs ``tests.runtime.guard_app:app`` for the code-first kind, and a sandbox runtime
node for the microVM kind."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from lantern.store import open_store

KINDS = ("graph", "plain", "code", "microvm")
# The agent each kind's schedule fires, and the input it is fired with.
AGENTS: dict[str, dict[str, Any] | None] = {
    "graph": {"graph": {"nodes": [{"id": "start", "type": "trigger"}], "edges": []}},
    "plain": {"model": "offline/echo", "system": "Be brief."},  # no provider: offline
    "code": None,  # tick-code of tests.runtime.guard_app, the server's --app
    "microvm": {"runtime": {"tier": "microvm", "entrypoint": "jobs:three", "driver": "sandbox"}},
}
INPUT: dict[str, dict[str, Any]] = {"microvm": {"hold": 0}}


def agent_of(kind: str) -> str:
    return f"tick-{kind}"


def define(put: Callable[..., Any], kind: str, schedule: str, **fields: Any) -> None:
    """PUT the kind's agent (a code-first one is the app's) and a schedule firing it."""
    definition = AGENTS[kind]
    if definition is not None:
        put(f"/v1/agents/{agent_of(kind)}", {"name": agent_of(kind), **definition})
    body = {"agentName": agent_of(kind), "input": INPUT.get(kind, {}), **fields}
    put(f"/v1/schedules/{schedule}", body)


def keys(database_url: str, run_ids: list[str]) -> list[str | None]:
    """The idempotency key each run was created under, as the database holds it."""

    async def read() -> list[str | None]:
        store = open_store(database_url)
        await store.open()
        try:
            return [await store.run_key(r) for r in run_ids]
        finally:
            await store.close()

    return asyncio.run(read())


def check_fired(database_url: str, schedule: str, runs: list[dict[str, Any]]) -> None:
    """Each run finished in success, one per fire time, under that fire time's key."""
    assert runs, f"schedule {schedule} started no run"
    assert [r["status"] for r in runs] == ["succeeded"] * len(runs), runs
    times = [r["schedule"]["fireTime"] for r in runs]
    assert len(set(times)) == len(times), f"a fire time of {schedule} started two runs"
    assert {r["schedule"]["name"] for r in runs} == {schedule}
    assert keys(database_url, [r["id"] for r in runs]) == [
        f"schedule|{schedule}|{t}" for t in times
    ]
