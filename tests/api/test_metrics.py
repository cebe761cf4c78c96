"""`/metrics` of a real `lantern serve` parses as Prometheus text and moves as runs run."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from lantern.demo.receiver import Receiver
from tests.server import ALL_SCOPES, Server, make_key

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(server: Server) -> Samples:
    response = httpx.get(f"{server.url}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def agent(name: str, *nodes: dict[str, Any]) -> dict[str, Any]:
    ids = ["start", *(n["id"] for n in nodes)]
    return {
        "name": name,
        "graph": {
            "nodes": [{"id": "start", "type": "trigger"}, *nodes],
            "edges": [{"source": a, "target": b} for a, b in pairwise(ids)],
        },
    }


MODEL_OUTPUT = {
    "text": "hello",
    "model": "small-1",
    "provider": "acme",
    "usage": {"inputTokens": 120, "outputTokens": 30, "costUsd": 0.25},
}


def test_metrics_count_runs_steps_deliveries_tokens_and_journal_writes(
    api_server: Server, receiver: Receiver
) -> None:
    key = make_key(api_server.database_url, "default", ALL_SCOPES)
    before = scrape(api_server)
    with httpx.Client(
        base_url=api_server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as api:
        agents = [
            agent(
                "works",
                # noop returns its arguments: here, what a model step's output looks like.
                {"id": "m", "type": "tool", "data": {"tool": "noop", "args": MODEL_OUTPUT}},
                {
                    "id": "d",
                    "type": "tool",
                    "data": {"tool": "two_deliveries", "args": {"url": receiver.url}},
                },
                {
                    "id": "h",
                    "type": "connector",
                    "data": {"connector": "http", "url": f"{receiver.url}/hook"},
                },
            ),
            agent("breaks", {"id": "x", "type": "tool", "data": {"tool": "explode"}}),
        ]
        for definition in agents:
            api.put(f"/v1/agents/{definition['name']}", json=definition).raise_for_status()
        statuses = []
        for name in ("works", "breaks", "works"):
            run_id = api.post("/v1/runs", json={"agentName": name, "input": {}}).json()["id"]
            run = api.get(f"/v1/runs/{run_id}", params={"wait": 30}).json()
            statuses.append(run["status"])
        assert statuses == ["succeeded", "failed", "succeeded"]
    after = scrape(api_server)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("lantern_runs_started_total") == 3
    assert moved("lantern_runs_finished_total", status="succeeded") == 2
    assert moved("lantern_runs_finished_total", status="failed") == 1
    assert moved("lantern_step_failures_total") == 1
    assert moved("lantern_journal_events_total", kind="run_started") == 3
    # 2 x (trigger, m, d, h) + (trigger, x)
    assert moved("lantern_journal_events_total", kind="step_started") == 10
    assert moved("lantern_step_duration_seconds_count", node_type="tool") == 5
    assert moved("lantern_step_duration_seconds_count", node_type="connector") == 2
    assert moved("lantern_step_duration_seconds_sum", node_type="tool") > 0
    assert moved("lantern_deliveries_total", kind="tool", outcome="delivered") == 4
    assert (
        moved("lantern_model_tokens_total", provider="acme", model="small-1", direction="input")
        == 240
    )
    assert (
        moved("lantern_model_tokens_total", provider="acme", model="small-1", direction="output")
        == 60
    )
    assert moved("lantern_model_cost_usd_total", provider="acme", model="small-1") == 0.5
    # Each drive's opening commit, then one per finished step: 2 x (1 + 3) + (1 + 1).
    assert moved("lantern_journal_write_seconds_count") == 10
    assert moved("lantern_journal_write_seconds_sum") > 0
    assert ("lantern_step_retries_total", frozenset()) in after
    assert ("lantern_recoveries_total", frozenset()) in after
