"""Applying agent definitions and creating runs: the entry points every edge calls."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from lantern.engine.graph import parse_agent
from lantern.errors import NotFound
from lantern.ids import new_run_id
from lantern.store.base import Store
from lantern.store.records import AgentVersion, Run

DEFAULT_WORKSPACE = "default"


async def apply_agent(
    store: Store, definition: Any, workspace: str = DEFAULT_WORKSPACE
) -> AgentVersion:
    """Validate (raising DefinitionError with every problem) and store a new version."""
    graph = parse_agent(definition)
    return await store.put_agent(workspace, graph.name, definition)


async def create_run(
    store: Store, agent_name: str, input: Any, workspace: str = DEFAULT_WORKSPACE
) -> Run:
    """A queued run pinned to the agent's newest version."""
    agent = await store.get_agent(workspace, agent_name)
    if agent is None:
        raise NotFound(f"agent {agent_name!r} not found (apply it first)")
    now = datetime.now(UTC)
    run = Run(
        id=new_run_id(),
        workspace=workspace,
        agent_name=agent.name,
        agent_version=agent.version,
        status="queued",
        input=input,
        output=None,
        error=None,
        created_at=now,
        updated_at=now,
    )
    await store.create_run(run)
    return run
