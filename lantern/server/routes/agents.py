"""/v1/agents: apply (a new immutable version each time), read and list definitions."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query, Request

from lantern.engine.code_agents import ensure_stored
from lantern.engine.runs import apply_agent
from lantern.errors import Conflict, DefinitionError, NotFound
from lantern.server.deps import scope, services
from lantern.server.routes.runs import decode_cursor, encode_cursor
from lantern.server.schemas import PROBLEMS, AgentOut, AgentPage
from lantern.store.records import ApiKey
from lantern.views import agent_json

router = APIRouter(prefix="/v1/agents", tags=["agents"], responses=PROBLEMS)
Name = Annotated[str, Path(min_length=1, max_length=100)]


@router.put("/{name}", response_model=AgentOut)
async def put(
    name: Name,
    definition: Annotated[dict[str, Any], Body()],
    request: Request,
    key: Annotated[ApiKey, Depends(scope("agents:write"))],
) -> dict[str, Any]:
    given = definition.setdefault("name", name)
    if given != name:
        raise DefinitionError([f"the definition is named {given!r} but was sent to {name!r}"])
    s = services(request)
    if s.worker.app.agent_for(key.workspace, name) is not None:
        raise Conflict(f"agent {name!r} is a code-first agent of this server's app")
    runtime, most = definition.get("runtime"), s.settings.vm_max_timeout
    timeout = runtime.get("timeoutS") if isinstance(runtime, dict) else None
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > most:
        # A VM holds a runtime node's slot while it lives: its length is the operator's to cap.
        raise DefinitionError(
            [f"runtime.timeoutS {timeout} is above LANTERN_VM_MAX_TIMEOUT ({most:g} s)"]
        )
    agent = await apply_agent(
        s.store,
        definition,
        key.workspace,
        knows_tool=s.knows_tool(key.workspace),
        routes=s.worker.models.routes,
    )
    return agent_json(agent)


@router.get("", response_model=AgentPage)
async def list_agents(
    request: Request,
    key: Annotated[ApiKey, Depends(scope("agents:read"))],
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> dict[str, Any]:
    s = services(request)
    for code in s.worker.app.agents.values():  # listed like any agent, where it serves
        if code.serves(key.workspace):
            await ensure_stored(s.store, key.workspace, code)
    agents = await s.store.list_agents(key.workspace, limit=limit + 1, after=decode_cursor(cursor))
    more = len(agents) > limit
    agents = agents[:limit]
    return {
        "items": [agent_json(a) for a in agents],
        "nextCursor": encode_cursor(agents[-1].name) if more else None,
    }


@router.get("/{name}", response_model=AgentOut)
async def get(
    name: Name,
    request: Request,
    key: Annotated[ApiKey, Depends(scope("agents:read"))],
    version: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
) -> dict[str, Any]:
    s = services(request)
    code = s.worker.app.agent_for(key.workspace, name)
    if code is not None:
        await ensure_stored(s.store, key.workspace, code)
    agent = await s.store.get_agent(key.workspace, name, version)
    if agent is None:
        raise NotFound(f"agent {name!r}{f' v{version}' if version else ''} not found")
    return agent_json(agent)
