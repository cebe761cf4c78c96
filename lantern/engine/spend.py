"""What the journal says a run has spent on models, and the budget gate of its steps."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lantern.engine.graph import Graph
from lantern.models.budget import Budget, Gate, spent_in
from lantern.models.call import journal_usage
from lantern.models.registry import Models
from lantern.store.base import Store
from lantern.store.records import Run, RunUsage

MODEL_NODES = frozenset({"ai-step"})


def gate(
    store: Store,
    run: Run,
    budget: Mapping[str, Any] | None,
    spent: Callable[[], RunUsage],
    models: Models,
) -> Gate:
    """The run's budget gate: its agent's ``budget``, its workspace's configured limits, and
    the prices of ``models`` (the process's model configuration)."""
    return Gate(
        run_spent=spent,
        run_budget=Budget.from_json(budget),
        workspace=run.workspace,
        workspace_spent=store.workspace_usage,
        workspace_budgets=models.workspace_budgets,
        prices=models.prices,
    )


def _is_model_step(graph: Graph, step: str) -> bool:
    # Not every step is a node: an anomaly's pause is an implicit approval step.
    node = graph.nodes.get(step)
    return node is not None and node.type in MODEL_NODES


def of_graph(graph: Graph, outputs: Mapping[str, Any]) -> RunUsage:
    """The completed model steps' usage (what the journal holds, folded)."""
    return spent_in(
        out.get("usage")
        for step, out in outputs.items()
        if isinstance(out, dict) and _is_model_step(graph, step)
    )


def step_usage(graph: Graph, step: str, output: Any) -> dict[str, Any] | None:
    """The usage a step's ``step_completed`` carries (model steps only)."""
    return journal_usage(output) if _is_model_step(graph, step) else None
