"""POST /v1/runs?wait=SECONDS: one request for a short run, against a real `lantern serve`.

A run that finishes within the wait is answered 200 with its output (what GET ?wait gives);
one that does not (it parks at an approval) is answered 202 as it stands once the wait is up.
The graph agent stands here for every kind of run: the answer comes from the commit that
finishes the run (tests/conformance/test_notify.py), which plain, code-first and microVM runs
write through the same fenced commit (lantern.engine.commits).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

import lantern
from tests.server import ALL_SCOPES, Server, make_key

NOOP = {
    "name": "noop",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "t", "type": "tool", "data": {"tool": "noop", "args": {"x": "{{ input.x }}"}}},
        ],
        "edges": [{"source": "start", "target": "t"}],
    },
}
PARKS = {
    "name": "parks",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "ok", "type": "approval", "data": {"prompt": "Go on?"}},
        ],
        "edges": [{"source": "start", "target": "ok"}],
    },
}


@pytest.fixture
def api(api_server: Server) -> Iterator[httpx.Client]:
    key = make_key(api_server.database_url, "default", ALL_SCOPES)
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=api_server.url, headers=headers, timeout=30) as client:
        for definition in (NOOP, PARKS):
            client.put(f"/v1/agents/{definition['name']}", json=definition).raise_for_status()
        yield client


def test_a_create_waits_for_the_run_to_finish_within_the_wait(api: httpx.Client) -> None:
    """One server per backend for all three parts: starting one is most of the time here."""
    a_short_run_is_answered_finished_in_one_request(api)
    a_run_that_does_not_finish_in_the_wait_is_answered_as_it_stands(api)
    a_bad_wait_is_a_problem_and_creates_nothing(api)
    with lantern.Client(str(api.base_url), api.headers["Authorization"].split()[1]) as client:
        run = client.create_run("noop", {"x": 3}, wait=20)  # the SDK's one request
        assert run.status == "succeeded" and run.output == {"x": 3}


def a_short_run_is_answered_finished_in_one_request(api: httpx.Client) -> None:
    made = api.post("/v1/runs", params={"wait": 20}, json={"agentName": "noop", "input": {"x": 7}})
    assert made.status_code == 200, made.text
    run = made.json()
    assert run["status"] == "succeeded" and run["output"] == {"x": 7}
    assert run["children"] == []
    assert api.get(f"/v1/runs/{run['id']}").json()["status"] == "succeeded"
    # A retried create (same Idempotency-Key) of a finished run answers it at once.
    for _ in range(2):
        again = api.post(
            "/v1/runs",
            params={"wait": 20},
            json={"agentName": "noop", "input": {"x": 8}},
            headers={"Idempotency-Key": "k-1"},
        )
        assert again.status_code == 200 and again.json()["output"] == {"x": 8}
    assert again.json()["id"] != run["id"]


def a_run_that_does_not_finish_in_the_wait_is_answered_as_it_stands(api: httpx.Client) -> None:
    began = time.monotonic()
    made = api.post("/v1/runs", params={"wait": 0.5}, json={"agentName": "parks", "input": {}})
    assert time.monotonic() - began >= 0.5
    assert made.status_code == 202, made.text
    assert made.json()["status"] in ("queued", "running", "waiting")
    # Without ?wait nothing changed: 202 at once with the queued (or just started) run.
    plain = api.post("/v1/runs", json={"agentName": "noop", "input": {"x": 1}})
    assert plain.status_code == 202 and plain.json()["status"] in ("queued", "running")


def a_bad_wait_is_a_problem_and_creates_nothing(api: httpx.Client) -> None:
    before = len(api.get("/v1/runs", params={"limit": 200}).json()["items"])
    for wait in ("-1", "61", "soon"):
        bad = api.post("/v1/runs", params={"wait": wait}, json={"agentName": "noop", "input": {}})
        assert bad.status_code == 422, bad.text
        assert bad.headers["content-type"].startswith("application/problem+json")
    assert len(api.get("/v1/runs", params={"limit": 200}).json()["items"]) == before
