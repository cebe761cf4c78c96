"""Retrying a failed or cancelled run from a step (Temporal's reset, DBOS's fork).

The retry is a new run, pinned to the original's agent version, whose journal opens with the
original's completed steps that do not depend on ``fromStep``: each is copied as a
``step_started`` and ``step_completed`` pair carrying ``replayedFrom`` (the original run, the
event's seq and its hash), so it is served from the journal and never executed again. The copy
is chained like any event, so the new run's chain and receipt verify on their own, and each
replayed step names the original event anyone can check it against.

The new run is created parked and due at once (``waiting`` with ``wake_at`` now), in one
transaction with its opening events, so whichever replica claims it goes on from the journal
exactly as after an approval: the steps left (``fromStep``, everything downstream of it, and
whatever had not completed) run with this run's id and so with fresh idempotency keys.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from lantern.engine import events as ev
from lantern.engine.graph import Graph, parse_agent
from lantern.engine.journal import INLINE_LIMIT, EventWriter, output_of
from lantern.errors import Conflict, NotFound, UsageError
from lantern.ids import new_run_id
from lantern.models.router import Routes
from lantern.store.base import Store
from lantern.store.codec import dumps
from lantern.store.records import Blob, Event, NewEvent, Run

RETRYABLE_STATUSES = ("failed", "cancelled")


async def retry_run(
    store: Store, original: Run, from_step: str | None = None, *, routes: Routes | None = None
) -> Run:
    """The new run (``waiting``, due now); Conflict unless ``original`` failed or was
    cancelled, UsageError for a ``from_step`` that is not one of its graph's steps.
    ``routes``, the process's configured model routes, refuses (DefinitionError) a version
    naming a ``route:NAME`` they no longer have, as its drive would, before a run is made."""
    if original.status == "succeeded":
        raise Conflict(f"run {original.id} succeeded: there is nothing to retry")
    if original.status not in RETRYABLE_STATUSES:
        raise Conflict(
            f"run {original.id} is {original.status}: only a failed or cancelled run is retried"
            " (cancel it first)"
        )
    agent = await store.get_agent(original.workspace, original.agent_name, original.agent_version)
    if agent is None:
        raise NotFound(f"agent {original.agent_name} v{original.agent_version} not found")
    graph = parse_agent(agent.definition, routes)
    if not isinstance(graph, Graph):
        raise UsageError(
            f"agent {original.agent_name} is a plain LLM agent: retry from a step is for graph"
            " agents (start a new run instead)"
        )
    redo = _redone(graph, from_step)
    journal = await store.events(original.id, blobs=True)
    now = datetime.now(UTC)
    run = Run(
        id=new_run_id(),
        workspace=original.workspace,
        agent_name=original.agent_name,
        agent_version=original.agent_version,
        status="waiting",
        input=original.input,
        output=None,
        error=None,
        created_at=now,
        updated_at=now,
        priority=original.priority,
        flow=original.flow,  # the same version and input: the same key, under the same limits
    )
    events = opening(run.id, original.id, from_step, journal, redo, graph)
    return await store.create_retry(run, events)


def _redone(graph: Graph, from_step: str | None) -> frozenset[str]:
    """The steps the retry runs again whatever the original did: ``from_step`` and every
    step downstream of it."""
    if from_step is None:
        return frozenset()
    if from_step not in graph.nodes:
        raise UsageError(
            f"fromStep {from_step!r} is not a step of agent {graph.name}"
            f" (its steps: {', '.join(n for n in graph.nodes if n != graph.trigger)})"
        )
    if from_step == graph.trigger:
        raise UsageError(
            f"fromStep {from_step!r} is the trigger: to run every step again, start a new run"
        )
    found, todo = {from_step}, [from_step]
    while todo:  # everything downstream, by a walk over successors
        for nxt in graph.successors[todo.pop()]:
            if nxt not in found:
                found.add(nxt)
                todo.append(nxt)
    return frozenset(found)


def opening(
    run_id: str,
    original_id: str,
    from_step: str | None,
    journal: Sequence[Event],
    redo: frozenset[str],
    graph: Graph,
) -> list[NewEvent]:
    """``run_started`` with where the run came from, then each completed step kept, in the
    original's order, as a started and completed pair that says which event it copies."""
    w = EventWriter(run_id)
    events = [w.event(ev.RUN_STARTED, {"retryOf": original_id, "fromStep": from_step})]
    for e in journal:
        if e.kind != ev.STEP_COMPLETED or e.step_id is None or e.step_id in redo:
            continue
        source = {"runId": original_id, "seq": e.seq, "hash": e.hash}
        kind = graph.nodes[e.step_id].type if e.step_id in graph.nodes else None
        started = {"type": kind, "replayedFrom": source}
        events.append(w.event(ev.STEP_STARTED, started, step_id=e.step_id, attempt=e.attempt))
        events.append(_completed(w, e, source))
    return events


def _completed(w: EventWriter, e: Event, source: dict[str, Any]) -> NewEvent:
    """The copy of a step_completed: its output (by reference when it is large) and no usage,
    which the original run spent and this one did not."""
    output = output_of(e)
    body = dumps(output).encode()
    data: dict[str, Any]
    if len(body) <= INLINE_LIMIT:
        data = {"output": output, "replayedFrom": source}
        return w.event(ev.STEP_COMPLETED, data, step_id=e.step_id, attempt=e.attempt)
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    data = {"outputRef": digest, "outputBytes": len(body), "replayedFrom": source}
    event = w.event(ev.STEP_COMPLETED, data, step_id=e.step_id, attempt=e.attempt)
    return replace(event, blob=Blob(digest, body))
