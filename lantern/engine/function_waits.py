"""What resolves a code-first run's parked call: a due timer, a decision, a finished child.

A parked call's wait is its ``step_waiting`` data: ``{"kind": "timer", "dueAt"}``,
``{"kind": "approval", "prompt", "assignees"[, "dueAt", "onTimeout"]}``, ``{"kind":
"subagent", "agentName", "childRunId"}`` or ``{"kind": "signal", "name"[, "dueAt"]}`` (which
signal it takes, the step ledger decides: ``lantern.engine.signals``). Its resolution is the
``step_resumed`` data and the step's outcome: an output, or a StepError for a child that did
not succeed. Unlike a graph's approval node, a rejection is an answer (``Approval.approved``
is False), not a failure.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from lantern.engine import signals
from lantern.engine.ledger import Ledger
from lantern.engine.waits import decided
from lantern.errors import StepError
from lantern.store.base import Store

# (the step_resumed data, the step's outcome: its output or its failure)
Resolution = tuple[dict[str, Any], Any]


async def resolved(
    store: Store, ledger: Ledger, step: str, wait: Mapping[str, Any]
) -> Resolution | None:
    run_id = ledger.run_id
    kind = wait.get("kind")
    now_ms = time.time() * 1000
    if kind == "timer":
        if now_ms < wait["dueAt"]:
            return None
        return {"dueAt": wait["dueAt"]}, None
    if kind == "approval":
        d = (await store.decisions(run_id)).get(step)
        if d is not None:
            answer = decided(d)
        elif "dueAt" in wait and now_ms >= wait["dueAt"]:
            decision = "approved" if wait.get("onTimeout") == "approve" else "rejected"
            answer = {"decision": decision, "by": "timeout", "comment": None}
        else:
            return None
        return answer, answer
    if kind == "subagent":
        child = await store.get_run(wait["childRunId"])
        if child is None or not child.finished:
            return None
        resumed = {"childRunId": child.id, "status": child.status}
        if child.status == "succeeded":
            return resumed, child.output
        message = (child.error or {}).get("message", child.status)
        return resumed, StepError(
            f"sub-agent run {child.id} ({child.agent_name}) {child.status}: {message}",
            error_class="tool",
        )
    if kind == "signal":
        return await signals.resolved(store, ledger, step)
    raise ValueError(f"step {step!r} waits for {kind!r}, which code-first runs do not know")
