"""What each node type does when its step runs. Nodes never touch the store."""

from lantern.nodes.base import NodeExecutor, StepContext, executor_for

__all__ = ["NodeExecutor", "StepContext", "executor_for"]
