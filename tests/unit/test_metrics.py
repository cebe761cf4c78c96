"""The commit hook counts journal events by kind, so retries and failures need no hook of their
own; model usage is counted from step outputs that name their model and provider."""

from __future__ import annotations

from prometheus_client import REGISTRY

from lantern.engine import journal
from lantern.engine.journal import EventWriter
from lantern.observability import metrics


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_committed_events_are_counted_by_kind() -> None:
    before = {
        "retries": sample("lantern_step_retries_total"),
        "failures": sample("lantern_step_failures_total"),
        "cancelled": sample("lantern_runs_finished_total", status="cancelled"),
        "retrying": sample("lantern_journal_events_total", kind="step_retrying"),
    }
    w = EventWriter("run_metrics")
    journal.count_committed(
        [
            w.event("step_failed", {"error": {}}, step_id="a", attempt=1),
            w.event("step_retrying", {"attempt": 2}, step_id="a", attempt=1),
            w.event("step_retrying", {"attempt": 3}, step_id="a", attempt=2),
            w.event("run_cancelled", {"by": "request"}),
        ]
    )
    assert sample("lantern_step_retries_total") - before["retries"] == 2
    assert sample("lantern_journal_events_total", kind="step_retrying") - before["retrying"] == 2
    assert sample("lantern_step_failures_total") - before["failures"] == 1
    assert sample("lantern_runs_finished_total", status="cancelled") - before["cancelled"] == 1


def test_model_usage_needs_usage_model_and_provider() -> None:
    labels = {"provider": "p-unit", "model": "m-unit"}
    metrics.model_usage({"usage": {"inputTokens": 7, "outputTokens": 2, "costUsd": 0.5}, **labels})
    metrics.model_usage({"usage": {"inputTokens": 100}, "model": "m-unit"})  # no provider
    metrics.model_usage({"usage": "lots", **labels})
    metrics.model_usage(["not", "a", "dict"])
    assert sample("lantern_model_tokens_total", direction="input", **labels) == 7
    assert sample("lantern_model_tokens_total", direction="output", **labels) == 2
    assert sample("lantern_model_cost_usd_total", **labels) == 0.5
