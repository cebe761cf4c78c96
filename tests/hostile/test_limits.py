"""Limits (docs/security.md) against a real `lantern serve`: each hostile input gets a clear 413 or
422, or fails its step naming the limit; nothing is stored or changed; /healthz keeps
answering within a second throughout."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lantern import limits
from tests.hostile.kit import Peer, Tenant, attack, connector_agent
from tests.server import Server

SCOPES = "runs:execute,runs:read,agents:write,agents:read,admin"


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.release.set()
    p.close()


@pytest.fixture(scope="module")
def server(peer: Peer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp("limits")
    env = {"LANTERN_EGRESS_ALLOW": f"127.0.0.1:{peer.port}"}
    s = Server(f"sqlite:///{tmp / 'lantern.db'}", tmp / "serve.log", env=env).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tenant(server: Server) -> Iterator[Tenant]:
    t = Tenant(server, "mallory", SCOPES)
    yield t
    t.close()


def tool_agent(name: str, template: str) -> dict[str, Any]:
    return {
        "name": name,
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "t", "type": "tool", "data": {"tool": "noop", "args": {"x": template}}},
            ],
            "edges": [{"source": "start", "target": "t"}],
        },
    }


def failed_naming(tenant: Tenant, run_id: str, *words: str) -> str:
    run = tenant.finished(run_id, timeout=60)
    assert run["status"] == "failed", run
    message = str(run["error"]["message"] if "message" in run["error"] else run["error"])
    for word in words:
        assert word in message, message
    return message


BOMBS = {
    "repeat": "{{ 'a' * 200000000 }}",
    "repeat-input": "{{ input.s * input.n }}",
    "power": "{{ 7 ** (9 ** 7) }}",
    "loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "center": "{{ 'a'|center(1000000000) }}",
    "format": "{{ '{:>999999999}'.format(1) }}",
    "doubling": "{% macro d(x, n) %}{{ d(x ~ x, n - 1) if n else x|length }}{% endmacro %}"
    "{{ d('abcdefghij', 40) }}",
    "list": "{{ ((range(1000)|list) * 1000)|join(',') }}",
    "recursion": "{% macro f() %}{{ f() }}{{ f() }}{% endmacro %}{{ f() }}",
}


def test_template_bombs_fail_their_step_naming_the_limit(server: Server, tenant: Tenant) -> None:
    for name, template in BOMBS.items():
        assert tenant.apply(tool_agent(f"bomb-{name}", template)).status_code == 200
    with attack(server, "template-bomb", len(BOMBS)) as probe:
        started = time.monotonic()
        runs = {tenant.start(f"bomb-{name}", {"s": "x", "n": 10**9}): name for name in BOMBS}
        for run_id, name in runs.items():
            message = failed_naming(tenant, run_id, "template error")
            assert "limit" in message or "RecursionError" in message, (name, message)
            assert not [
                e
                for e in tenant.events(run_id)
                if e["kind"] == "step_completed" and e["stepId"] == "t"
            ]
        took = time.monotonic() - started
    assert took < 30, took
    assert probe.worst < 1.0


def test_a_definition_past_the_limits_is_refused_and_not_stored(
    server: Server, tenant: Tenant
) -> None:
    def chain(name: str, n: int) -> dict[str, Any]:
        nodes = [{"id": "start", "type": "trigger"}] + [
            {"id": f"n{i}", "type": "tool", "data": {"tool": "noop"}} for i in range(n)
        ]
        edges = [{"source": "start", "target": "n0"}] + [
            {"source": f"n{i}", "target": f"n{i + 1}"} for i in range(n - 1)
        ]
        return {"name": name, "graph": {"nodes": nodes, "edges": edges}}

    huge = tool_agent("huge", "x" * (limits.MAX_DEFINITION_BYTES + 10))
    deep: Any = "leaf"
    for _ in range(limits.MAX_JSON_DEPTH + 50):
        deep = [deep]
    nested = tool_agent("nested", "x")
    nested["graph"]["nodes"][1]["data"]["args"] = {"x": deep}
    cycle = chain("cycle", 900)
    cycle["graph"]["edges"].append({"source": "n899", "target": "n1"})
    cases = [
        (chain("chain", 4000), 422, "the limits are"),
        (huge, 413, "limit"),
        (nested, 422, "nests deeper"),
        (cycle, 422, "cycle"),
    ]
    with attack(server, "definition", len(cases)):
        for definition, status, words in cases:
            started = time.monotonic()
            response = tenant.apply(definition)
            assert response.status_code == status, response.text[:300]
            assert words in response.json()["detail"], response.json()["detail"][:300]
            assert time.monotonic() - started < 5
            assert tenant.http.get(f"/v1/agents/{definition['name']}").status_code == 404
    # A long chain within the limits is fine, and quick.
    started = time.monotonic()
    assert tenant.apply(chain("long", limits.MAX_NODES - 1)).status_code == 200
    assert time.monotonic() - started < 5


def test_json_nested_past_the_limit_is_refused_at_every_parse(
    server: Server, tenant: Tenant, peer: Peer
) -> None:
    assert tenant.apply(tool_agent("plain", "{{ input }}")).status_code == 200
    assert tenant.apply(connector_agent("deep-answer", f"{peer.url}/deep/600")).status_code == 200
    before = len(tenant.http.get("/v1/runs", params={"limit": 200}).json()["items"])
    body = '{"agentName": "plain", "input": ' + "[" * 600 + "]" * 600 + "}"
    with attack(server, "json-depth", 3):
        response = tenant.http.post(
            "/v1/runs", content=body, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 422, response.text
        assert "nests deeper than the limit" in response.json()["detail"]
        shallow = {"agentName": "plain", "input": json.loads("[" * 150 + "]" * 150)}
        response = tenant.http.post("/v1/runs", json=shallow)
        assert response.status_code == 422, response.text
        failed_naming(tenant, tenant.start("deep-answer"), "nested deeper than the limit")
    after = len(tenant.http.get("/v1/runs", params={"limit": 200}).json()["items"])
    assert after == before + 1  # the failed step's run only


def _peak_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_an_http_answer_is_bounded_in_size_and_time(
    server: Server, tenant: Tenant, peer: Peer
) -> None:
    assert tenant.apply(connector_agent("big", f"{peer.url}/big/40")).status_code == 200
    slow = connector_agent("slow", f"{peer.url}/slow", timeoutMs=1000)
    assert tenant.apply(slow).status_code == 200
    assert server.proc is not None
    peak = _peak_rss_kb(server.proc.pid)
    with attack(server, "http-answer", 2):
        big = tenant.start("big")
        started = time.monotonic()
        trickle = tenant.start("slow")
        failed_naming(tenant, big, "response size limit", str(limits.MAX_RESPONSE_BYTES))
        failed_naming(tenant, trickle, "timed out")
        assert time.monotonic() - started < 15
    # A 40 MB answer read no further than the limit: the server grew by far less than 40 MB.
    assert _peak_rss_kb(server.proc.pid) - peak < 30_000


def test_an_agent_that_calls_itself_stops_at_the_depth_limit(
    server: Server, tenant: Tenant
) -> None:
    bomb = {
        "name": "fork",
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "again", "type": "subagent", "data": {"agentName": "fork", "input": {}}},
            ],
            "edges": [{"source": "start", "target": "again"}],
        },
    }
    assert tenant.apply(bomb).status_code == 200
    with attack(server, "subagent-depth", 1):
        root = tenant.start("fork")
        failed_naming(tenant, root)
    runs = tenant.http.get("/v1/runs", params={"agentName": "fork", "limit": 100}).json()["items"]
    assert len(runs) == limits.MAX_SUBAGENT_DEPTH + 1
    messages = [json.dumps(tenant.http.get(f"/v1/runs/{r['id']}").json()["error"]) for r in runs]
    assert any(f"the limit of {limits.MAX_SUBAGENT_DEPTH}" in m for m in messages), messages


# -- a server that drives one run at a time: queued runs stay queued --------------------


@pytest.fixture(scope="module")
def narrow(peer: Peer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp("narrow")
    env = {
        "LANTERN_EGRESS_ALLOW": f"127.0.0.1:{peer.port}",
        "LANTERN_MAX_CONCURRENT_RUNS": "1",
        "LANTERN_MAX_QUEUED_RUNS": "3",
        "LANTERN_OPERATOR_WORKSPACE": "ops",
        "LANTERN_METRICS": "admin",
    }
    s = Server(f"sqlite:///{tmp / 'lantern.db'}", tmp / "serve.log", env=env).start()
    yield s
    s.stop()


def test_queued_runs_are_limited_per_workspace_and_claimed_fairly(
    narrow: Server, peer: Peer
) -> None:
    alice, bob, ops = (Tenant(narrow, w, SCOPES) for w in ("alice", "bob", "ops"))
    try:
        agent = connector_agent("wait", f"{peer.url}/hold/{{{{ input.n }}}}")
        assert alice.apply(agent).status_code == 200 and bob.apply(agent).status_code == 200
        peer.release.clear()
        with attack(narrow, "queue-quota", 2):
            first = alice.start("wait", {"n": "a1"})
            deadline = time.monotonic() + 20
            while "/hold/a1" not in peer.hits:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            queued = [alice.start("wait", {"n": f"a{i}"}) for i in (2, 3)]
            a4, key = {"agentName": "wait", "input": {"n": "a4"}}, {"Idempotency-Key": "a4"}
            made = alice.http.post("/v1/runs", json=a4, headers=key)
            assert made.status_code == 202, made.text
            queued.append(made.json()["id"])
            refused = alice.http.post("/v1/runs", json={"agentName": "wait", "input": {"n": "a5"}})
            assert refused.status_code == 422, refused.text
            assert "LANTERN_MAX_QUEUED_RUNS" in refused.json()["detail"]
            # A retry of a create that was stored is answered its run, the queue full or not.
            again = alice.http.post("/v1/runs", json=a4, headers=key)
            assert again.status_code in (200, 202) and again.json()["id"] == queued[-1], again.text
            time.sleep(0.01)
            theirs = bob.start("wait", {"n": "b1"})  # a quota of its own

            # An admin of alice's workspace sees the replica, and none of bob's runs.
            mine = alice.http.get("/v1/workers").json()["items"]
            assert {r for w in mine for r in w["runs"]} == {first}
            everyone = ops.http.get("/v1/workers").json()["items"]
            assert first in {r for w in everyone for r in w["runs"]}
            assert httpx.get(f"{narrow.url}/metrics", timeout=10).status_code == 401
            assert alice.http.get("/metrics").status_code == 403
            assert ops.http.get("/metrics").status_code == 200
        peer.release.set()
        for run_id in [first, *queued, theirs]:
            assert (
                alice.finished(run_id, 60)["status"] == "succeeded"
                if run_id != theirs
                else bob.finished(run_id, 60)["status"] == "succeeded"
            )
        holds = [h.removeprefix("/hold/") for h in peer.hits if h.startswith("/hold/")]
        # Fair: bob's workspace, served least recently, goes next, not behind alice's backlog.
        assert holds[:5] == ["a1", "b1", "a2", "a3", "a4"], holds
        names = {r["input"]["n"] for r in alice.http.get("/v1/runs").json()["items"]}
        assert "a5" not in names  # the refused run was not stored
    finally:
        for t in (alice, bob, ops):
            t.close()
