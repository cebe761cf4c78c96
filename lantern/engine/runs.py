"""Applying agent definitions and creating runs: the entry points every edge calls."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from lantern import config, flow, limits
from lantern.app import App
from lantern.engine import code_agents, code_input
from lantern.engine.graph import parse_agent
from lantern.engine.microvm import MicroVmAgent
from lantern.engine.validate import Knows, tool_problems
from lantern.errors import Conflict, DefinitionError, NotFound, QueueFull, TooLarge, UsageError
from lantern.ids import new_run_id
from lantern.models.router import Routes
from lantern.store.base import Store
from lantern.store.codec import dumps, value_problem
from lantern.store.records import AgentVersion, FlowOf, Run, RunFlow

DEFAULT_WORKSPACE = "default"
# Stores a new run started by this process (``Worker.start_new``), or None when it did not;
# the queue limit applies to a run it stores queued after all (QueueFull).
Start = Callable[[Run, str | None, str, FlowOf, int], Awaitable[Run | None]]
CANCEL_PATIENCE = 5.0  # seconds a child refused under a cancel waits for the cancel to land


async def apply_agent(
    store: Store,
    definition: Any,
    workspace: str = DEFAULT_WORKSPACE,
    *,
    knows_tool: Knows | None = None,
    routes: Routes | None = None,
) -> AgentVersion:
    """Validate (raising DefinitionError with every problem) and store a new version.

    ``knows_tool``, given by a server that loaded an app, also refuses tools it lacks;
    ``routes``, the process's configured model routes, refuses a ``route:NAME`` they lack.

    Validating a large definition is CPU work (up to a megabyte, a thousand nodes, every
    template parsed): it runs on a thread, so the event loop every tenant shares keeps
    answering meanwhile."""
    graph = await asyncio.to_thread(_validated, definition, knows_tool, routes)
    if isinstance(graph, MicroVmAgent):
        await check_runnable(store, graph)
    return await store.put_agent(workspace, graph.name, definition)


async def check_runnable(store: Store, agent: MicroVmAgent) -> None:
    """Refuse a microVM agent no registered runtime node could ever run: a driver none runs,
    or more memory than the largest has (with no node registered yet, the run will wait)."""
    nodes = await store.list_nodes()
    if not nodes:
        return
    problems = []
    drivers = sorted({n.driver for n in nodes})
    able = [n for n in nodes if agent.driver in ("auto", n.driver)]
    if not able:
        problems.append(
            f"runtime.driver {agent.driver!r} runs on no runtime node here;"
            f" the nodes run: {', '.join(drivers)}"
        )
    largest = max(n.memory_mb for n in (able or nodes))
    if agent.memory_mb > largest:
        problems.append(
            f"runtime.memoryMb {agent.memory_mb} is above every runtime node's memory"
            f" (the largest has {largest} MB)"
        )
    if problems:
        raise DefinitionError(problems)


def _validated(
    definition: Any, knows_tool: Knows | None = None, routes: Routes | None = None
) -> Any:
    """Storable JSON (depth first, iteratively), within the size limit, then a valid graph
    whose tools the app has; a graph past the node limit is refused before anything walks it.
    Every problem of the definition is reported together."""
    graph = definition.get("graph") if isinstance(definition, dict) else None
    nodes = graph.get("nodes") if isinstance(graph, dict) else None
    if isinstance(nodes, list) and len(nodes) > limits.MAX_NODES:
        raise DefinitionError(
            [f"the graph has {len(nodes)} nodes; the limits are {limits.MAX_NODES} nodes"]
        )
    problem = value_problem(definition)
    if problem is not None:
        raise DefinitionError([f"the definition cannot be stored: {problem}"])
    size = len(dumps(definition).encode())
    if size > limits.MAX_DEFINITION_BYTES:
        raise TooLarge(
            f"the definition is {size} bytes; the limit is {limits.MAX_DEFINITION_BYTES} bytes"
        )
    missing = [] if knows_tool is None else tool_problems(definition, knows_tool)
    try:
        parsed = parse_agent(definition, routes)
    except DefinitionError as exc:
        raise DefinitionError([*exc.problems, *missing]) from None
    if missing:
        raise DefinitionError(missing)
    return parsed


async def create_run(
    store: Store,
    agent_name: str,
    input: Any,
    workspace: str = DEFAULT_WORKSPACE,
    *,
    idempotency_key: str | None = None,
    run_id: str | None = None,
    parent_id: str | None = None,
    app: App | None = None,
    priority: int = flow.DEFAULT_PRIORITY,
    start: Start | None = None,
) -> Run:
    """A queued run pinned to the agent's newest version.

    With an idempotency key, a repeated request gets the run the first one created, and a
    different request under the same key is a Conflict. A code-first agent of ``app`` has
    its input checked against the function's signature (a UsageError names what does not
    fit), and this function's version stored for the workspace, so the run is pinned to it.
    Under an agent with flow control (docs/flow-control.md), the run's concurrency key is its
    input rendered by the pinned version's ``concurrency.key``; a key that does not render is
    a UsageError and no run is made. ``priority`` (0-9) orders the runs that may start.
    ``start`` (``Worker.start_new``) may store the run already started by this process, with
    its lease and opening in the same transaction; a run it did not store is stored here.
    The workspace's queue limit counts the runs stored queued, each in one place: here before
    a run is stored queued, or (a run ``start`` stores) in the store's own transaction, only
    when it leaves the run queued after all. A run started at its create never waits.
    """
    flow.check_priority(priority)
    problem = value_problem([agent_name, input])
    if problem is not None:
        raise UsageError(f"the run's agent name or input cannot be stored: {problem}")
    code = None if app is None else app.agent_for(workspace, agent_name)
    if code is not None:
        code_input.arguments(code, input)
        await code_agents.ensure_stored(store, workspace, code)
    digest = _request_digest(agent_name, input)
    # A retry is found by the insert's conflict below, which spares every first create a
    # lookup; only what refuses before the insert looks first: a child's parent may have
    # finished since, and the workspace's queue may have filled.
    if parent_id is not None:
        if retried := await _retried(store, workspace, idempotency_key, digest):
            return retried
        await _check_parent(store, parent_id)
    quota = config.max_queued_runs()
    now = datetime.now(UTC)
    run = Run(
        id=run_id or new_run_id(),
        workspace=workspace,
        agent_name=agent_name,
        agent_version=0,  # the store pins the newest version in the same statement
        status="queued",
        input=input,
        output=None,
        error=None,
        created_at=now,
        updated_at=now,
        parent_id=parent_id,
        priority=priority,
    )

    def flow_of(concurrency: Any, max_runs: Any) -> RunFlow | None:
        fields = flow.run_fields(concurrency, max_runs, input)
        return None if fields is None else RunFlow(*fields)

    try:
        started = None
        if start is not None and parent_id is None:
            started = await start(run, idempotency_key, digest, flow_of, quota)
        if started is None and await store.queued_count(workspace, quota) >= quota:
            raise QueueFull
        created = started or await store.create_run(
            run, idempotency_key=idempotency_key, request_digest=digest, flow=flow_of
        )
    except QueueFull:
        if retried := await _retried(store, workspace, idempotency_key, digest):
            return retried
        raise UsageError(
            f"workspace {workspace!r} has {quota} runs queued, the limit "
            "(LANTERN_MAX_QUEUED_RUNS); wait for some to start"
        ) from None
    except Conflict:
        assert idempotency_key is not None
        found = await store.run_for_key(workspace, idempotency_key)
        if found is None:
            raise
        return _same_request(found, digest, idempotency_key)  # a retry, or a concurrent twin
    if parent_id is not None:
        # A cancel of an ancestor that came between the check and the insert walked the
        # children before this one existed: flag it here, so it never runs.
        parent = await store.get_run(parent_id)
        if parent is None or parent.cancel_requested or parent.finished:
            await store.request_cancel(created.id)
    return created


async def _cancelled_first(store: Store, parent_id: str) -> None:
    """Give the cancel of the run asking for a child the time to reach its drive (which
    stops the step asking, and this with it), so that the run ends ``cancelled`` rather than
    failed by the refused child; the refusal follows after a while in any case."""
    deadline = time.monotonic() + CANCEL_PATIENCE
    while time.monotonic() < deadline:
        parent = await store.get_run(parent_id)
        if parent is None or parent.finished:
            return
        await asyncio.sleep(0.1)


async def _check_parent(store: Store, parent_id: str) -> None:
    """A child run is refused under a chain of MAX_SUBAGENT_DEPTH runs (an agent that calls
    itself is a chain, not a fork bomb) and under an ancestor being cancelled or finished
    (a cancel of the root stops the tree). Every kind of parent run, one check; the walk
    stops past the limit."""
    depth = 0
    above: str | None = parent_id
    while above is not None and depth <= limits.MAX_SUBAGENT_DEPTH:
        run = await store.get_run(above)
        if run is None:
            raise NotFound(f"parent run {above} not found")
        if run.cancel_requested or (run.finished and depth == 0):
            if run.cancel_requested:
                await _cancelled_first(store, parent_id)
            state = "being cancelled" if run.cancel_requested else run.status
            raise Conflict(f"run {run.id} is {state}: it starts no sub-agent")
        depth += 1
        above = run.parent_id
    if depth > limits.MAX_SUBAGENT_DEPTH:
        raise UsageError(
            f"this run is {depth - 1} sub-agents deep, the limit of"
            f" {limits.MAX_SUBAGENT_DEPTH}; it starts no more"
        )


def _request_digest(agent_name: str, input: Any) -> str:
    canonical = json.dumps([agent_name, input], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


async def _retried(store: Store, workspace: str, key: str | None, digest: str) -> Run | None:
    """The run an earlier request under ``key`` created, if any."""
    found = None if key is None else await store.run_for_key(workspace, key)
    return None if found is None or key is None else _same_request(found, digest, key)


def _same_request(found: tuple[Run, str], digest: str, key: str) -> Run:
    run, stored = found
    if stored != digest:
        raise Conflict(f"idempotency key {key!r} was used for a different request")
    return run
