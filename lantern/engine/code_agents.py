"""Code-first agents in the agents table: how a run finds and pins a function's version.

A code agent lives in the user's App, not in a definition someone applied; but runs are
pinned to a stored agent version, every replica lists agents from the store, and a replica
without the function must still see what a run needs. So each workspace that uses a code
agent gets a stored definition ``{"name", "code": {"version", "module", "function"}}``, put
again (a new version) whenever the function's version changes. A run is pinned to the stored
version it was created under and so to that ``code.version``; ``run_repinned`` in its journal
(``lantern runs resume RUN_ID --version NEW``) moves it to another.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lantern.app import CodeAgent
from lantern.engine import events as ev
from lantern.store.base import Store
from lantern.store.records import Event

RUN_REPINNED = ev.RUN_REPINNED  # an operator moved the run to another version of its code
RUN_PARKED = ev.RUN_PARKED  # a replica without the run's version left it to one that has it

# Per store: (workspace, agent, version) already stored, so a create costs no extra read.
_stored: weakref.WeakKeyDictionary[Store, set[tuple[str, str, str]]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class CodeSpec:
    """A stored code agent definition, as the runner reads it."""

    name: str
    version: str
    module: str
    function: str

    @classmethod
    def of(cls, definition: Mapping[str, Any]) -> CodeSpec | None:
        code = definition.get("code")
        if not isinstance(code, Mapping):
            return None
        return cls(
            str(definition.get("name")),
            str(code.get("version")),
            str(code.get("module", "")),
            str(code.get("function", "")),
        )


async def ensure_stored(store: Store, workspace: str, agent: CodeAgent) -> None:
    """Make the workspace's newest version of ``agent.name`` this function's version."""
    done = _stored.setdefault(store, set())
    key = (workspace, agent.name, agent.version)
    if key in done:
        return
    newest = await store.get_agent(workspace, agent.name)
    if newest is None or newest.definition != agent.definition():
        await store.put_agent(workspace, agent.name, agent.definition())
    done.add(key)


def pinned_version(spec: CodeSpec, journal: Iterable[Event]) -> str:
    """The version a run must be driven by: its stored one, or the last it was moved to."""
    version = spec.version
    for e in journal:
        if e.kind == RUN_REPINNED:
            version = str(e.data.get("version"))
    return version
