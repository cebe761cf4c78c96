"""The node types: which exist, which park a run, and the executor of each."""

from __future__ import annotations

from lantern.nodes import ai_step, approval, connector, signal, subagent, tool, trigger
from lantern.nodes.base import NodeExecutor

_EXECUTORS: dict[str, NodeExecutor] = {
    "trigger": trigger.execute,
    "tool": tool.execute,
    "connector": connector.execute,
    "ai-step": ai_step.execute,
    "approval": approval.execute,
    "subagent": subagent.execute,
    "signal": signal.execute,
}
AVAILABLE_TYPES = frozenset(_EXECUTORS)
PLANNED_TYPES: frozenset[str] = frozenset()  # named in errors as "not available yet"
WAITING_TYPES = frozenset(
    {"approval", "subagent", "signal"}
)  # park the run; no step timeout applies


def executor_for(node_type: str) -> NodeExecutor:
    return _EXECUTORS[node_type]
