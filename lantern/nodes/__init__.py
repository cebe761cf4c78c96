"""What each node type does when its step runs. Nodes never touch the store."""

from lantern.nodes.base import Node, NodeExecutor, StepContext
from lantern.nodes.registry import executor_for

__all__ = ["Node", "NodeExecutor", "StepContext", "executor_for"]
