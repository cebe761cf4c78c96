"""Deciding at an approval: checked against the journal, stored once, and the run woken."""

from __future__ import annotations

from typing import Literal

from lantern.engine.journal import fold
from lantern.errors import Conflict, Forbidden
from lantern.store.base import Store
from lantern.store.records import Decision, Run


async def decide(
    store: Store,
    run: Run,
    node_id: str,
    decision: Literal["approved", "rejected"],
    decided_by: str,
    comment: str | None = None,
    *,
    decided_by_name: str | None = None,
) -> Decision:
    """Record the one decision at ``node_id``; Conflict when the run is not waiting there or
    someone decided first. Whichever replica claims the woken run journals it and goes on.
    An approval with ``assignees`` is decided only by them when the deciding key has a name
    (``decided_by_name``, Forbidden otherwise); a key without a name is not checked, as the
    command line on the database is not."""
    if run.finished:
        raise Conflict(f"run {run.id} has already finished ({run.status})")
    state = fold(await store.events(run.id))
    wait = state.waiting.get(node_id)
    if wait is None or wait.get("kind") != "approval":
        raise Conflict(f"run {run.id} is not waiting for a decision at node {node_id!r}")
    assignees = wait.get("assignees") or []
    if decided_by_name is not None and assignees and decided_by_name not in assignees:
        raise Forbidden(
            f"the key named {decided_by_name!r} is not among the assignees of {node_id!r}"
            f" ({', '.join(map(str, assignees))})"
        )
    made = Decision(run.id, node_id, decision, decided_by, comment, None, decided_by_name)
    if not await store.decide(made):
        raise Conflict(f"node {node_id!r} of run {run.id} has already been decided")
    return made
