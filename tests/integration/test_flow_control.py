"""Flow control across two `lantern serve` replicas on PostgreSQL (docs/flow-control.md): runs
of graph, code-first and plain agents, each agent one run per customer at a time, call a real
HTTP peer that records how many requests of each path it held at once. Created on both
replicas at once, no key ever has two runs in flight and different keys run side by side; then
the replica running a key's first run of each kind is SIGKILLed mid-step, and the other takes
the key's next runs only once the killed runs' slots free (their leases expire, the survivor
re-drives them to their end). One pair of replicas serves both parts. (A microVM run is
claimed by the same query before its drive hands it to the runtime scheduler.)"""

from __future__ import annotations

import secrets
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg

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


KINDS = ("graph", "code", "plain")


def test_one_run_per_key_in_flight_across_two_replicas_and_a_sigkill(
    pg_url: str, tmp_path: Path
) -> None:
    peer = SlowPeer(0.4)  # far within the lease: a killed replica's call ends before it does
    env = {
        "OPENAI_BASE_URL": f"{peer.url}/v1",
        "OPENAI_API_KEY": "sk-test",
        "LANTERN_LEASE_TTL": "4s",
        "LANTERN_RECOVERY_INTERVAL": "500ms",
    }
    name = f"flow-{secrets.token_hex(4)}"  # the replicas' connections' application_name

    def start(n: str) -> Server:
        named = {**env, "PGAPPNAME": f"{name}-{n}"}
        app = "tests.integration.flow_app:app"
        return Server(pg_url, tmp_path / f"{n}.log", env=named, app=app).start()

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(start, "ab")
    assert a.proc is not None and b.proc is not None
    try:
        key = make_key(pg_url, "default", ALL_SCOPES)
        with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
            side_by_side(http, a, b, peer)
            pause_outside_claims(b, pg_url, f"{name}-b")  # so that A claims each first run
            peer.hold()  # and is in its step when it is killed
            ids = create_two_of_each_kind(http, a, peer)
            deadline = time.monotonic() + 30
            while peer.stats()["inFlight"] < len(KINDS):
                assert time.monotonic() < deadline, peer.stats()
                time.sleep(0.02)
            a.kill()
            b.proc.send_signal(signal.SIGCONT)
            peer.release()
            ended = {
                kind: [http.get(f"{b.url}/v1/runs/{i}", params={"wait": 60}).json() for i in two]
                for kind, two in ids.items()
            }
            journals = {kind: [events(http, b.url, i) for i in two] for kind, two in ids.items()}
    finally:
        b.proc.send_signal(signal.SIGCONT)
        for s in (a, b):
            if s.proc is not None and s.proc.poll() is None:
                s.stop()
        stats = peer.stats()
        peer.close()
    for kind in KINDS:
        assert [r["status"] for r in ended[kind]] == ["succeeded"] * 2, (kind, ended[kind])
        first, second = journals[kind]
        assert any(e["kind"] == "run_recovered" for e in first), f"{kind}: not taken over"
        first_end = max(e["at"] for e in first)
        second_start = min(e["at"] for e in second)
        assert second_start > first_end, f"{kind}: acme's second run started in its slot"
    by_path = stats["mostByPath"]
    paths = {f"/{kind}/{c}" for kind in ("graph", "code") for c in ("acme", "bolt")}
    assert paths | {"/v1/chat/completions"} == set(by_path), by_path
    assert all(n == 1 for n in by_path.values()), f"a key had two runs in flight: {by_path}"
    assert stats["most"] >= 2, "different keys never ran side by side"


def side_by_side(http: httpx.Client, a: Server, b: Server, peer: SlowPeer) -> None:
    """Runs of two customers created on both replicas at once all succeed (the peer's counts
    are checked at the end); bad settings and priorities are refused."""
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
        created = list(pool.map(lambda u, body: http.post(f"{u}/v1/runs", json=body), urls, bodies))
    assert all(r.status_code == 202 for r in created), [r.text for r in created]
    assert {r.json()["concurrencyKey"] for r in created} == {"acme", "bolt"}
    ended = [http.get(f"{a.url}/v1/runs/{r.json()['id']}", params={"wait": 60}) for r in created]
    assert [r.json()["status"] for r in ended] == ["succeeded"] * len(created)


def create_two_of_each_kind(http: httpx.Client, a: Server, peer: SlowPeer) -> dict[str, list[str]]:
    given = {"customer": "acme", "peer": peer.url}
    inputs = {"graph": given, "code": given, "plain": "acme"}
    ids: dict[str, list[str]] = {kind: [] for kind in KINDS}
    for _ in range(2):
        for kind in KINDS:
            body = {"agentName": f"{kind}-per-customer", "input": inputs[kind]}
            created = http.post(f"{a.url}/v1/runs", json=body)
            assert created.status_code == 202, created.text
            ids[kind].append(created.json()["id"])
    return ids


def events(http: httpx.Client, url: str, run_id: str) -> list[dict[str, Any]]:
    page = http.get(f"{url}/v1/runs/{run_id}/events", params={"limit": 1000})
    assert page.status_code == 200, page.text
    found: list[dict[str, Any]] = page.json()["items"]
    return found


def pause_outside_claims(server: Server, pg_url: str, name: str) -> None:
    """SIGSTOP the replica (its connections' application_name ``name``) at a moment it holds
    no advisory lock: paused in a claim, it would stop every replica's claims."""
    assert server.proc is not None
    with psycopg.connect(pg_url, autocommit=True) as pg:
        while True:
            server.proc.send_signal(signal.SIGSTOP)
            held = pg.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                " WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = %s",
                (name,),
            ).fetchone()
            if held == (0,):
                return
            server.proc.send_signal(signal.SIGCONT)
            time.sleep(0.05)
