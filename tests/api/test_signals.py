"""Signals (docs/signals.md) against a real `lantern serve`, one per backend for the module:
sent early and kept, taken one per wait in arrival order, a journaled timeout, for a graph
`signal` node and a code-first `ctx.wait_for_signal` (async and plain `def`); an
Idempotency-Key retry is one signal; 409 to a finished run; 404/403; hostile input answered
with problem+json that stores nothing; the SDK and `lantern runs signal`."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from lantern.engine.signals import MAX_PAYLOAD_BYTES
from lantern.sdk import AsyncClient, ConflictError
from tests.api.test_cli_operate import local
from tests.api.test_cli_remote import lantern
from tests.conftest import BACKENDS
from tests.server import ALL_SCOPES, Server, make_key

APP = "tests.crash.signal_app:app"


def signal(node: str, name: str, **data: Any) -> dict[str, Any]:
    return {"id": node, "type": "signal", "data": {"name": name, **data}}


# start -> go -> pay1 -> pay2, and go -> late (times out): the output has pay2 and late.
PAYMENTS = {
    "name": "payments",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            signal("go", "start"),
            signal("pay1", "payment"),
            signal("pay2", "payment"),
            signal("late", "never", timeoutMs=300),
        ],
        "edges": [
            {"source": "start", "target": "go"},
            {"source": "go", "target": "pay1"},
            {"source": "pay1", "target": "pay2"},
            {"source": "go", "target": "late"},
        ],
    },
}


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp("signals")
    schema = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp / 'lantern.db'}"
    else:
        base: str = request.getfixturevalue("pg_base_url")
        schema = f"t_{secrets.token_hex(6)}"
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        url = f"{base}{'&' if '?' in base else '?'}options=-csearch_path%3D{schema}"
    found = Server(url, tmp / "serve.log", app=APP).start()
    try:
        yield found
    finally:
        found.stop()
        if schema is not None:
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(scope="module")
def key(server: Server) -> str:
    return make_key(server.database_url, "default", ALL_SCOPES)


@pytest.fixture(scope="module")
def api(server: Server, key: str) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        client.put("/v1/agents/payments", json=PAYMENTS).raise_for_status()
        yield client


def start(api: httpx.Client, agent: str) -> str:
    made = api.post("/v1/runs", json={"agentName": agent, "input": {}})
    assert made.status_code == 202, made.text
    run_id: str = made.json()["id"]
    deadline = time.monotonic() + 20
    while api.get(f"/v1/runs/{run_id}").json()["status"] != "waiting":
        assert time.monotonic() < deadline, f"run {run_id} never parked"
        time.sleep(0.05)
    return run_id


def send(api: httpx.Client, run_id: str, name: str, payload: Any, **headers: str) -> Any:
    sent = api.post(f"/v1/runs/{run_id}/signals/{name}", json={"payload": payload}, headers=headers)
    assert sent.status_code == 202, sent.text
    assert sent.json()["name"] == name and sent.json()["runId"] == run_id
    return sent.json()


def finished(api: httpx.Client, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        run: dict[str, Any] = api.get(f"/v1/runs/{run_id}", params={"wait": 10}).json()
        if run["status"] in ("succeeded", "failed", "cancelled"):
            return run
        assert time.monotonic() < deadline, run


def events(api: httpx.Client, run_id: str, kind: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = api.get(f"/v1/runs/{run_id}/events").json()["items"]
    return [e for e in items if e["kind"] == kind]


@pytest.mark.parametrize("agent", ["payments", "await-payment"])
def test_signals_sent_early_are_kept_and_taken_in_order_and_a_timeout_is_journaled(
    api: httpx.Client, agent: str
) -> None:
    """Both payments arrive while the run waits for ``start``: the first wait for
    ``payment`` takes the first, the next wait the second; ``never`` times out."""
    run_id = start(api, agent)
    one = send(api, run_id, "payment", {"n": 1})
    two = send(api, run_id, "payment", {"n": 2})
    time.sleep(0.2)
    # Kept, and the run, which waits for another signal, was not woken for them.
    assert api.get(f"/v1/runs/{run_id}").json()["status"] == "waiting"
    assert [e["kind"] for e in events(api, run_id, "run_resumed")] == []
    send(api, run_id, "start", None)
    run = finished(api, run_id)
    assert run["status"] == "succeeded", run
    taken = {e["stepId"]: e["data"]["signalId"] for e in events(api, run_id, "signal_received")}
    if agent == "payments":  # a graph's signal nodes
        assert taken["pay1"] == one["id"] and taken["pay2"] == two["id"]
        assert run["output"] == {
            "pay2": {"received": True, "payload": {"n": 2}},
            "late": {"received": False},
        }
        late = "late"
    else:  # ctx.wait_for_signal: the payload itself, None after the timeout
        assert taken["payment"] == one["id"] and taken["payment#2"] == two["id"]
        assert run["output"] == {"payments": [{"n": 1}, {"n": 2}], "late": None}
        late = "never"
    assert len(taken) == 3  # start, and the two payments: each signal taken once
    [timed_out] = [e for e in events(api, run_id, "step_resumed") if e["stepId"] == late]
    assert timed_out["data"]["timedOut"] is True and timed_out["data"]["name"] == "never"
    # A finished run takes no more: 409, problem+json.
    refused = api.post(f"/v1/runs/{run_id}/signals/payment", json={"payload": 3})
    assert refused.status_code == 409
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert "finished" in refused.json()["detail"]


def test_a_plain_def_agent_waits_for_a_signal_too(api: httpx.Client) -> None:
    run_id = start(api, "await-blocking")
    send(api, run_id, "go", ["a", 1])
    run = finished(api, run_id)
    assert (run["status"], run["output"]) == ("succeeded", ["a", 1])


def test_an_idempotency_key_retry_is_one_signal(api: httpx.Client) -> None:
    run_id = start(api, "await-payment")
    first = send(api, run_id, "payment", {"n": 1}, **{"Idempotency-Key": "pay-1"})
    again = send(api, run_id, "payment", {"n": 1}, **{"Idempotency-Key": "pay-1"})
    assert again["id"] == first["id"]
    other = api.post(
        f"/v1/runs/{run_id}/signals/payment",
        json={"payload": {"n": 9}},
        headers={"Idempotency-Key": "pay-1"},
    )
    assert other.status_code == 409 and "different signal" in other.json()["detail"]
    send(api, run_id, "payment", {"n": 2})
    send(api, run_id, "start", None)
    run = finished(api, run_id)
    # One signal for the two sends under pay-1: the second wait took {"n": 2}.
    assert run["output"]["payments"] == [{"n": 1}, {"n": 2}], run
    # A retry after the run finished still answers the one signal it stored.
    late = send(api, run_id, "payment", {"n": 1}, **{"Idempotency-Key": "pay-1"})
    assert late["id"] == first["id"]


def test_unknown_runs_other_workspaces_and_bad_input_are_problems_that_store_nothing(
    api: httpx.Client, server: Server
) -> None:
    run_id = start(api, "await-payment")
    missing = api.post("/v1/runs/run_" + "0" * 28 + "/signals/start", json={"payload": 1})
    assert missing.status_code == 404
    bob = make_key(server.database_url, "bob", ALL_SCOPES)
    theirs = httpx.post(
        f"{server.url}/v1/runs/{run_id}/signals/start",
        json={"payload": 1},
        headers={"Authorization": f"Bearer {bob}"},
    )
    assert theirs.status_code == 403
    reader = make_key(server.database_url, "default", "runs:read")
    scoped = httpx.post(
        f"{server.url}/v1/runs/{run_id}/signals/start",
        json={"payload": 1},
        headers={"Authorization": f"Bearer {reader}"},
    )
    assert scoped.status_code == 403
    big = "x" * (MAX_PAYLOAD_BYTES + 1)
    for name, body, status in [
        ("start", {"payload": big}, 413),
        ("no%20spaces", {"payload": 1}, 422),
        ("-dash-first", {"payload": 1}, 422),
        ("x" * 101, {"payload": 1}, 422),
        ("start", {"payload": 1, "extra": 2}, 422),
        ("start", [1], 422),
    ]:
        answer = api.post(f"/v1/runs/{run_id}/signals/{name}", json=body)
        assert answer.status_code == status, (name, answer.text)
        assert answer.headers["content-type"].startswith("application/problem+json")
    broken = api.post(
        f"/v1/runs/{run_id}/signals/start",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert broken.status_code in (400, 422) and broken.headers["content-type"].startswith(
        "application/problem+json"
    )
    time.sleep(0.3)  # nothing was stored, so nothing woke the run
    run = api.get(f"/v1/runs/{run_id}").json()
    assert run["status"] == "waiting"
    assert events(api, run_id, "signal_received") == []
    api.post(f"/v1/runs/{run_id}/cancel").raise_for_status()


async def test_the_sdk_and_the_cli_send_signals(
    server: Server, key: str, api: httpx.Client
) -> None:
    run_id = start(api, "await-payment")
    async with AsyncClient(server.url, api_key=key) as client:
        sent = await client.signal(run_id, "payment", {"n": 1}, idempotency_key="sdk-1")
        again = await client.signal(run_id, "payment", {"n": 1}, idempotency_key="sdk-1")
        assert sent["id"] == again["id"] and sent["runId"] == run_id
    cli = lantern(server, key, "runs", "signal", run_id, "payment", "--payload", '{"n": 2}')
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.startswith("sent: sig_")
    bad = lantern(server, key, "runs", "signal", run_id, "start", "--payload", "{nope")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    # On the database directly (no LANTERN_URL): stored the same, the parked run made due.
    local(server.database_url, "runs", "signal", run_id, "start").check_returncode()
    run = finished(api, run_id)
    assert run["output"]["payments"] == [{"n": 1}, {"n": 2}], run
    async with AsyncClient(server.url, api_key=key) as client:
        with pytest.raises(ConflictError):
            await client.signal(run_id, "payment", 3)
    ended = lantern(server, key, "runs", "signal", run_id, "payment")
    assert ended.returncode == 1 and "finished" in ended.stderr
