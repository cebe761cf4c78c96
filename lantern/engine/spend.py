"""The budget gate of a run's model calls, the same for every kind of run.

What the run has spent and what its agent allows are the run's step ledger's
(``Ledger.spent``, folded from the usage each model call's ``step_completed`` carries, and
``Ledger.budget``): a graph's ai-step, a plain agent's turn, a code-first or a microVM
``ctx.model`` are all gated by ``gate(store, run, ledger, models)``, read at call time."""

from __future__ import annotations

from typing import Any

from lantern.engine.graph import Graph
from lantern.engine.ledger import Ledger
from lantern.models.budget import Gate
from lantern.models.call import journal_usage
from lantern.models.registry import Models
from lantern.models.throttle import Limiter
from lantern.store.base import Store
from lantern.store.records import Run

MODEL_NODES = frozenset({"ai-step"})


def gate(store: Store, run: Run, ledger: Ledger, models: Models) -> Gate:
    """The run's budget gate: its ledger's spend and budget (the agent's), its workspace's
    configured limits, the prices of ``models`` (the process's model configuration) and the
    rate limits its workspace's calls are held to (every kind of run's model calls pass here)."""
    return Gate(
        run_spent=lambda: ledger.spent,
        run_budget=ledger.budget,
        workspace=run.workspace,
        workspace_spent=store.workspace_usage,
        workspace_budgets=models.workspace_budgets,
        prices=models.prices,
        limiter=Limiter(store, run.workspace),
    )


def _is_model_step(graph: Graph, step: str) -> bool:
    # Not every step is a node: an anomaly's pause is an implicit approval step.
    node = graph.nodes.get(step)
    return node is not None and node.type in MODEL_NODES


def step_usage(graph: Graph, step: str, output: Any) -> dict[str, Any] | None:
    """The usage a step's ``step_completed`` carries (model steps only)."""
    return journal_usage(output) if _is_model_step(graph, step) else None
