"""The public JSON shape (camelCase) of runs and events, for every edge."""

from __future__ import annotations

import json
from typing import Any

from lantern.store.records import AgentVersion, Delivery


def run_json(run: Any) -> dict[str, Any]:
    """A run of the store, or one the API client returned (they share these fields)."""
    return {
        "id": run.id,
        "agentName": run.agent_name,
        "agentVersion": run.agent_version,
        "status": run.status,
        "input": run.input,
        "output": run.output,
        "error": run.error,
        "createdAt": run.created_at.isoformat(),
        "updatedAt": run.updated_at.isoformat(),
        "usage": usage_json(run),
        "cancelRequested": run.cancel_requested,
        "parentRunId": getattr(run, "parent_id", None),
        "waitingForVersion": getattr(run, "waiting_for", None),
        "priority": getattr(run, "priority", 5),
        "concurrencyKey": flow_key(run),
    }


def flow_key(run: Any) -> str | None:
    """The concurrency key a run is claimed under; None without one (or a maxConcurrentRuns
    alone, whose key is empty)."""
    key = getattr(getattr(run, "flow", None), "key", None) or getattr(run, "concurrency_key", None)
    return key or None


def usage_json(run: Any) -> dict[str, Any]:
    """A run's model usage (tokens, USD and calls), as the store or the API client has it."""
    u = getattr(run, "usage", None)
    return {
        "inputTokens": getattr(u, "input_tokens", 0),
        "outputTokens": getattr(u, "output_tokens", 0),
        "costUsd": round(float(getattr(u, "cost_usd", 0.0)), 10),
        "modelCalls": getattr(u, "model_calls", 0),
    }


def delivery_json(d: Delivery) -> dict[str, Any]:
    return {
        "runId": d.run_id,
        "stepId": d.step_id,
        "name": d.name,
        "attempt": d.attempt,
        "kind": d.kind,
        "target": d.target,
        # claimed and never finished: the process died mid-delivery, the outcome is unknown
        "status": "unknown" if d.status == "claimed" else d.status,
        "idempotencyKey": d.idempotency_key,
        "response": d.response,
        "claimedAt": d.claimed_at.isoformat() if d.claimed_at else None,
        "completedAt": d.completed_at.isoformat() if d.completed_at else None,
    }


def agent_json(agent: AgentVersion) -> dict[str, Any]:
    definition = agent.definition
    code = definition.get("code") if isinstance(definition.get("code"), dict) else None
    out = {
        "name": agent.name,
        "version": agent.version,
        "definition": definition,
        "createdAt": agent.created_at.isoformat(),
        "kind": "code" if code else ("graph" if "graph" in definition else "plain"),
    }
    if code:
        out["codeVersion"] = code.get("version")
        out["module"] = code.get("module")
    return out


def event_json(event: Any, *, expand: bool = False) -> dict[str, Any]:
    """An event of the store, or one the API client returned (they share these fields).
    ``expand``: an output stored apart, read with the event, goes beside its reference as
    ``output`` (the hash chain covers the reference, not this copy; docs/receipts.md)."""
    data = event.data
    blob = getattr(event, "blob", None)
    if expand and blob is not None and "outputRef" in data:
        data = {**data, "output": json.loads(blob)}
    return {
        "seq": event.seq,
        "runId": event.run_id,
        "stepId": event.step_id,
        "nodeId": event.node_id,
        "kind": event.kind,
        "attempt": event.attempt,
        "data": data,
        "at": event.at.isoformat(),
        "hash": event.hash,
    }
