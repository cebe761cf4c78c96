"""The contract between the engine and a node type: the node, its step context, its answers.

Nodes are leaves: nothing here or in a node type imports ``lantern.engine``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from lantern.app import App, Toolbox, ToolContext
from lantern.effects.claims import Deliveries
from lantern.models import registry
from lantern.models.budget import Gate
from lantern.nodes import templates


@dataclass(frozen=True)
class Node:
    """One node of an agent's graph, as validated when the definition was applied."""

    id: str
    type: str
    data: Mapping[str, Any]


@dataclass(frozen=True)
class StepContext:
    run_id: str
    step_id: str
    node: Node
    attempt: int
    idempotency_key: str
    scope: Mapping[str, Any]  # what templates see: input and steps.<id>.output
    app: App
    http: httpx.AsyncClient
    deliveries: Deliveries
    # The run's workspace's webhook signing secrets, newest first (none: send unsigned).
    signing_secrets: Callable[[], Awaitable[list[str]]]
    # Model steps: the process's providers and routes, and the budget gate of this run.
    models: registry.Models
    gate: Gate | None = None
    # Start (or find, on a re-run) this step attempt's child run: (agent name, input) -> run id
    start_child: Callable[[str, Any], Awaitable[str]] | None = None
    # The workspace's secrets, opened (name -> value), for nodes/secrets.py alone: templates
    # see them only while the step runs, and never through ``scope``.
    secrets: Callable[[], Awaitable[dict[str, str]]] | None = None
    # Where a model step sends its answer's pieces as they are generated (live text).
    on_text: Callable[[str], None] | None = None
    workspace: str = ""  # the run's: which of the app's tools it may call

    @property
    def tools(self) -> Toolbox:
        """The app's tools as this run's workspace sees them."""
        return self.app.tools_for(self.workspace)

    def render(self, field: str, default: Any = None) -> Any:
        """The node's ``data[field]`` with its templates rendered."""
        return templates.render(
            self.node.data.get(field, default), dict(self.scope), where=f"{self.node.id}.{field}"
        )

    def render_url(self, field: str) -> Any:
        """``data[field]`` as a URL template: interpolated values percent-encoded."""
        return templates.render_url(
            self.node.data.get(field), dict(self.scope), where=f"{self.node.id}.{field}"
        )

    def tool_context(self) -> ToolContext:
        return ToolContext(
            self.run_id,
            self.step_id,
            self.attempt,
            self.idempotency_key,
            self.deliveries.once,
            self.workspace,
        )


@dataclass(frozen=True)
class Noted:
    """A step's answer (an output or a ``Waiting``) with events to journal before it, such
    as ``confidence_evaluated``."""

    value: Any
    notes: tuple[tuple[str, dict[str, Any]], ...]


@dataclass(frozen=True)
class Waiting:
    """A step's answer when it parks the run: journaled as ``step_waiting`` with ``data``
    (``kind`` approval or subagent), and resolved later by a decision or a finished child."""

    data: dict[str, Any]


NodeExecutor = Callable[[StepContext], Awaitable[Any]]
