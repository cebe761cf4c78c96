"""Moving a code-first run on to another version of its code, when an operator decides the
new code is compatible with what the run's journal holds (``lantern runs resume``)."""

from __future__ import annotations

from datetime import UTC, datetime

from lantern.engine import commits
from lantern.engine.code_agents import RUN_REPINNED, CodeSpec, pinned_version
from lantern.engine.journal import EventWriter, fold
from lantern.errors import Conflict, NotFound, UsageError
from lantern.store.base import Store
from lantern.store.records import Append, Run, RunUpdate


async def resume_run(store: Store, run_id: str, version: str, by: str, ttl: float) -> Run:
    """Pin the run to ``version`` (journaled ``run_repinned``) and make it due now."""
    if not isinstance(version, str) or not version.strip() or len(version) > 100:
        raise UsageError("the version must be a non-empty string of at most 100 characters")
    run = await store.get_run(run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found")
    agent = await store.get_agent(run.workspace, run.agent_name, run.agent_version)
    spec = None if agent is None else CodeSpec.of(agent.definition)
    if spec is None:
        raise UsageError(f"run {run_id} is not a code-first run: it has no code version")
    if run.finished:
        raise Conflict(f"run {run_id} has already finished ({run.status})")
    # Only a free or expired lease: a run being executed is not moved under its executor.
    lease = await store.acquire_lease(run_id, by, ttl, reclaim=False)
    if lease is None:
        raise Conflict(f"run {run_id} is being executed; it can be moved while it waits")
    journal = await store.events(run_id)
    state = fold(journal)
    w = EventWriter(run_id, state.last_seq, state.last_hash)
    event = w.event(
        RUN_REPINNED,
        {"from": pinned_version(spec, journal), "version": version, "by": by},
    )
    queued = run.status == "queued"
    update = RunUpdate("queued" if queued else "waiting", wake_at=datetime.now(UTC))
    await commits.commit(store, Append(lease, (event,), update), patience=ttl, run=run)
    if queued:
        await store.release_lease(lease)
    found = await store.get_run(run_id)
    assert found is not None
    return found
