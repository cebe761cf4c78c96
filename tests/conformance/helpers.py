"""What the store's conformance tests share: an agent, a run of it, an event."""

from __future__ import annotations

from datetime import UTC, datetime

from lantern.engine.runs import create_run
from lantern.ids import new_run_id
from lantern.store import NewEvent, Run, Store

DEFINITION = {"name": "a", "graph": {"nodes": [{"id": "start", "type": "trigger"}], "edges": []}}


async def new_run(store: Store, name: str = "a") -> Run:
    if await store.get_agent("default", name) is None:
        await store.put_agent("default", name, {**DEFINITION, "name": name})
    return await create_run(store, name, {"n": 1})


def ev(seq: int, kind: str, step: str | None = None, **data: object) -> NewEvent:
    return NewEvent(
        seq=seq,
        kind=kind,
        at=datetime.now(UTC),
        data=dict(data),
        step_id=step,
        node_id=step,
        attempt=1 if step else None,
    )


def fresh(agent: str, version: int) -> Run:
    """A run of ``agent`` as a create makes it, not stored yet (for ``start_new_run``)."""
    now = datetime.now(UTC)
    return Run(
        id=new_run_id(),
        workspace="default",
        agent_name=agent,
        agent_version=version,
        status="queued",
        input={"n": 1},
        output=None,
        error=None,
        created_at=now,
        updated_at=now,
    )
