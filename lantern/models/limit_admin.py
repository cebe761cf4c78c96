"""Setting, deleting and showing rate limits (docs/rate-limits.md): one way for the API
(``/v1/limits``) and for `lantern limits` on a database, so both refuse the same definitions
and give the same answer."""

from __future__ import annotations

import time
from typing import Any

from lantern.errors import DefinitionError, NotFound
from lantern.models.limit_spec import LimitSpec, check_name
from lantern.models.throttle import definitions, used
from lantern.store.model_limits import SERVER, ModelLimit, ModelLimitStore, limit_json

MAX_LIMITS = 100  # per workspace (and for the server): each model call reads them all


def scope_of(workspace: str, server: bool) -> str:
    return SERVER if server else workspace


async def set_limit(
    store: ModelLimitStore, workspace: str, name: str, spec: LimitSpec
) -> ModelLimit:
    """Create or replace the limit ``spec`` (``parse_limit``'s) defines, in ``workspace`` or
    (``"scope": "server"``) the server's; whoever calls decides who may set a server limit."""
    check_name(name)
    where = scope_of(workspace, spec.server)
    if await store.get_limit(where, name) is None:
        if len(await store.list_limits((where,))) >= MAX_LIMITS:
            # A refused definition, as a malformed one is: exit 1 on the CLI, 422 on the API.
            raise DefinitionError(
                [
                    f"at most {MAX_LIMITS} rate limits per workspace (and for the server):"
                    " every model call reads them; delete one first"
                ],
                "rate limit",
            )
    limit = await store.put_limit(
        where, name, spec.model, spec.tokens_per_minute, spec.requests_per_minute
    )
    definitions.forget()
    return limit


async def delete_limit(store: ModelLimitStore, workspace: str, name: str, server: bool) -> None:
    if not await store.delete_limit(scope_of(workspace, server), name):
        raise NotFound(f"rate limit {name!r} not found")
    definitions.forget()


async def list_limits(store: ModelLimitStore, workspace: str) -> list[dict[str, Any]]:
    """The limits a workspace's calls are held to: its own and the server's, as shown."""
    return [shown(limit) for limit in await store.list_limits((workspace, SERVER))]


def shown(limit: ModelLimit) -> dict[str, Any]:
    """A limit with its fill, ``used``: what its last minute holds, so an operator sees how
    close the fleet runs to it (`lantern limits list`, the UI's limits page)."""
    return {**limit_json(limit), "used": used(limit, int(time.time() * 1000))}
