"""A retried run pins its original's agent version, so that version is parsed again with the
model routes this process has now, as a drive would parse it: a ``route:NAME`` removed from
the configuration since the version was applied refuses the retry before any run is made."""

from __future__ import annotations

import pytest

from lantern.engine.cancel import cancel_run
from lantern.engine.rerun import retry_run
from lantern.engine.runs import DEFAULT_WORKSPACE, apply_agent, create_run
from lantern.errors import DefinitionError
from lantern.store import Store

ROUTED = {
    "name": "routed",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "draft", "type": "ai-step", "data": {"model": "route:fast", "prompt": "Hi"}},
        ],
        "edges": [{"source": "start", "target": "draft"}],
    },
}


async def test_a_retry_naming_a_route_no_longer_configured_is_refused(store: Store) -> None:
    routes = {"fast": ("offline/echo",)}
    await apply_agent(store, ROUTED, routes=routes)
    queued = await create_run(store, "routed", None)
    original = await cancel_run(store, queued.id, "w1", 30)  # no worker: cancelled at once
    assert original.status == "cancelled"

    with pytest.raises(DefinitionError, match="unknown model route 'fast'"):
        await retry_run(store, original, routes={})
    runs = await store.list_runs(DEFAULT_WORKSPACE)
    assert [r.id for r in runs] == [original.id]  # nothing was made

    retried = await retry_run(store, original, routes=routes)  # the route is back
    assert retried.status == "waiting" and retried.agent_version == original.agent_version
