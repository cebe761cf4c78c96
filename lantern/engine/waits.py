"""Parked steps: what resolves an approval, a signal or a sub-agent wait, and when a parked
run is due.

A run with nothing left to run but parked steps gives its lease up and holds no task. What
resolves a wait is stored outside the run's journal (a decision in ``approvals``, a signal in
``signals``, a child's status in ``runs``) until the run is driven again and journals it as
``step_resumed``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from lantern.engine import signals
from lantern.engine.graph import Graph
from lantern.engine.ledger import Ledger
from lantern.errors import StepError
from lantern.store.base import Store
from lantern.store.records import Decision

# (step, the step_resumed data, the step's outcome: its output or its failure)
Resolution = tuple[str, dict[str, Any], Any]


def decided(d: Decision) -> dict[str, Any]:
    """A decision as the journal keeps it, with who decided when it came through the API."""
    answer: dict[str, Any] = {"decision": d.decision, "by": d.decided_by, "comment": d.comment}
    if d.decided_by.startswith("key:"):
        answer["approver"] = {
            "keyId": d.decided_by.removeprefix("key:"),
            "keyName": d.decided_by_name,
        }
    return answer


async def resolved(store: Store, ledger: Ledger, graph: Graph) -> list[Resolution]:
    """The run's parked steps (``ledger.waiting``) that are resolved now."""
    run_id, waiting = ledger.run_id, ledger.waiting
    found: list[Resolution] = []
    approvals = [s for s, w in waiting.items() if w.get("kind") == "approval"]
    decisions = await store.decisions(run_id) if approvals else {}
    now_ms = time.time() * 1000
    for step, wait in waiting.items():
        if wait.get("kind") == "approval":
            d = decisions.get(step)
            if d is not None:
                answer = decided(d)
            elif "dueAt" in wait and now_ms >= wait["dueAt"]:
                decision = "approved" if wait.get("onTimeout") == "approve" else "rejected"
                answer = {"decision": decision, "by": "timeout", "comment": None}
            else:
                continue
            found.append((step, answer, _approval_outcome(graph, step, answer, wait)))
        elif wait.get("kind") == "signal":
            took = await signals.resolved(store, ledger, step)
            if took is not None:
                found.append((step, *took))
        elif wait.get("kind") == "subagent":
            child = await store.get_run(wait["childRunId"])
            if child is None or not child.finished:
                continue
            resumed = {"childRunId": child.id, "status": child.status}
            if child.status == "succeeded":
                found.append((step, resumed, child.output))
            else:
                message = (child.error or {}).get("message", child.status)
                failure = StepError(
                    f"sub-agent run {child.id} ({child.agent_name}) {child.status}: {message}",
                    error_class="tool",
                    retryable=True,
                )
                found.append((step, resumed, failure))
    return found


def _approval_outcome(
    graph: Graph, step: str, answer: dict[str, Any], wait: Mapping[str, Any]
) -> Any:
    """The approval's output; a rejection fails the step unless an edge is taken on it. An
    implicit approval (a confidence gate) answers with the output it held back."""
    rejected_edge = any(
        graph.conditions.get((step, t)) == "rejected" for t in graph.successors.get(step, ())
    )
    if answer["decision"] == "rejected" and not rejected_edge:
        why = f": {answer['comment']}" if answer.get("comment") else ""
        who = (answer.get("approver") or {}).get("keyName") or answer["by"]
        return StepError(f"approval {step!r} was rejected by {who}{why}", error_class="tool")
    return wait.get("output", answer)


def wake_at(waiting: Mapping[str, Mapping[str, Any]]) -> datetime | None:
    """The earliest timeout of a wait (an approval's, a signal's): a parked run is claimed
    then even if nothing resolves it."""
    due = [w["dueAt"] for w in waiting.values() if "dueAt" in w]
    return datetime.fromtimestamp(min(due) / 1000, UTC) if due else None
