"""Flow control across two `lantern serve` replicas on PostgreSQL (docs/flow-control.md): runs
of graph, code-first and plain agents, each agent one run per customer at a time, created on
both replicas at once, call a real HTTP peer that records how many requests of each path it
held at once. No key ever has two runs in flight, and different keys run side by side. (A
microVM run is claimed by the same query before its drive hands it to the runtime scheduler.)"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.server import ALL_SCOPES, Server, make_key
from tests.slow_peer import SlowPeer

RUNS_PER_KEY = 3
KEY = {"key": "{{ input.customer }}", "limit": 1}


def graph_agent(name: str) -> dict[str, object]:
    call = {
        "id": "call",
        "type": "connector",
        "data": {
            "connector": "http",
            "method": "POST",
            "url": "{{ input.peer }}/graph/{{ input.customer }}",
            "body": {},
        },
    }
    return {
        "name": name,
        "concurrency": KEY,
        "graph": {
            "nodes": [{"id": "start", "type": "trigger"}, call],
            "edges": [{"source": "start", "target": "call"}],
        },
    }


@pytest.fixture
def peer() -> Iterator[SlowPeer]:
    p = SlowPeer(0.4)
    yield p
    p.close()


def test_one_run_per_key_in_flight_across_two_replicas(
    pg_url: str, tmp_path: Path, peer: SlowPeer
) -> None:
    env = {"OPENAI_BASE_URL": f"{peer.url}/v1", "OPENAI_API_KEY": "sk-test"}
    app = "tests.integration.flow_app:app"
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(
            lambda n: Server(pg_url, tmp_path / f"{n}.log", env=env, app=app).start(), "ab"
        )
    try:
        key = make_key(pg_url, "default", ALL_SCOPES)
        with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
            plain = {"name": "plain-per-customer", "model": "gpt-4o-mini", "concurrency": KEY}
            plain["concurrency"] = {"key": "{{ input }}", "limit": 1}
            for definition in (graph_agent("graph-per-customer"), plain):
                put = http.put(f"{a.url}/v1/agents/{definition['name']}", json=definition)
                assert put.status_code == 200, put.text
            bad = {**plain, "name": "bad", "concurrency": {"key": "{{ input.", "limit": 1}}
            refused = http.put(f"{a.url}/v1/agents/bad", json=bad)
            assert refused.status_code == 422 and "concurrency.key" in refused.json()["detail"]
            for priority in (10, -1, "9", 2.5):
                body = {"agentName": "plain-per-customer", "input": "x", "priority": priority}
                answer = http.post(f"{a.url}/v1/runs", json=body)
                assert answer.status_code == 422, (priority, answer.text)
                assert answer.headers["content-type"] == "application/problem+json"
            bodies = []
            for _ in range(RUNS_PER_KEY):
                for customer in ("acme", "bolt"):
                    given = {"customer": customer, "peer": peer.url}
                    bodies.append({"agentName": "graph-per-customer", "input": given})
                    bodies.append({"agentName": "code-per-customer", "input": given})
                bodies.append({"agentName": "plain-per-customer", "input": "acme"})
            urls = [(a if i % 2 else b).url for i in range(len(bodies))]
            with ThreadPoolExecutor(8) as pool:  # created on both replicas at once
                created = list(
                    pool.map(lambda u, body: http.post(f"{u}/v1/runs", json=body), urls, bodies)
                )
            assert all(r.status_code == 202 for r in created), [r.text for r in created]
            ids = [r.json()["id"] for r in created]
            assert {r.json()["concurrencyKey"] for r in created} == {"acme", "bolt"}
            ended = [http.get(f"{a.url}/v1/runs/{i}", params={"wait": 60}).json() for i in ids]
    finally:
        for s in (a, b):
            s.stop()
    assert [r["status"] for r in ended] == ["succeeded"] * len(ids), ended
    stats = peer.stats()
    by_path = stats["mostByPath"]
    paths = {f"/{kind}/{c}" for kind in ("graph", "code") for c in ("acme", "bolt")}
    assert paths | {"/v1/chat/completions"} == set(by_path), by_path
    assert all(n == 1 for n in by_path.values()), f"a key had two runs in flight: {by_path}"
    assert stats["most"] >= 2, "different keys never ran side by side"
