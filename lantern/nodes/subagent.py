"""A subagent node starts a child run of another agent and parks the parent until it ends."""

from __future__ import annotations

from typing import Any

from lantern.nodes.base import StepContext, Waiting


async def execute(ctx: StepContext) -> Any:
    assert ctx.start_child is not None, "the runner provides start_child"
    agent = ctx.node.data["agentName"]
    child = await ctx.start_child(agent, ctx.render("input", None))
    return Waiting({"kind": "subagent", "agentName": agent, "childRunId": child})
