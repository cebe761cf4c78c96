"""/v1/schedules against a real `lantern serve` (both backends): the round trip, trigger now,
a run's schedule, and hostile input answered with problem+json that changes nothing."""

from __future__ import annotations

import secrets
from typing import Any

import httpx
import pytest

from tests.server import ALL_SCOPES, Server, make_key

TICK = {"name": "tick", "graph": {"nodes": [{"id": "start", "type": "trigger"}], "edges": []}}


@pytest.fixture
def api_server(module_server: Server) -> Server:
    """The module's server (both backends): every client is in a workspace of its own."""
    return module_server


def client(server: Server, name: str) -> httpx.Client:
    """A client with every scope in a new workspace ``name-…`` that no other client shares."""
    key = make_key(server.database_url, f"{name}-{secrets.token_hex(4)}", ALL_SCOPES)
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_a_schedule_round_trip_and_trigger_now(api_server: Server) -> None:
    with client(api_server, "alice") as alice, client(api_server, "bob") as bob:
        assert alice.put("/v1/agents/tick", json=TICK).status_code == 200
        body = {
            "agentName": "tick",
            "input": {"x": 1},
            "cron": "0 6 * * *",
            "timezone": "Europe/Paris",
            "catchup": "all",
        }
        put = alice.put("/v1/schedules/nightly", json=body)
        assert put.status_code == 200, put.text
        got = alice.get("/v1/schedules/nightly").json()
        assert got["cron"] == "0 6 * * *" and got["overlap"] == "skip" and got["catchup"] == "all"
        assert got["nextFireAt"].endswith(("T05:00:00Z", "T04:00:00Z")) and not got["paused"]
        assert bob.get("/v1/schedules/nightly").status_code == 404  # another workspace's
        fired = alice.post("/v1/schedules/nightly/trigger")
        assert fired.status_code == 202
        run = alice.get(f"/v1/runs/{fired.json()['id']}", params={"wait": 10}).json()
        assert run["status"] == "succeeded" and run["input"] == {"x": 1}
        assert run["schedule"]["name"] == "nightly"
        listed = alice.get("/v1/runs", params={"schedule": "nightly"}).json()["items"]
        assert [r["id"] for r in listed] == [run["id"]]
        assert alice.get("/v1/schedules/nightly").json()["lastRunId"] == run["id"]
        # Filters beside ?schedule= are applied in the query: full pages, a cursor to the rest.
        assert alice.put("/v1/agents/tock", json={**TICK, "name": "tock"}).status_code == 200
        second = alice.post("/v1/schedules/nightly/trigger").json()["id"]
        assert alice.put("/v1/schedules/nightly", json={**body, "agentName": "tock"}).is_success
        alice.post("/v1/schedules/nightly/trigger")
        alice.post("/v1/schedules/nightly/trigger")
        ticks: dict[str, str | int] = {"schedule": "nightly", "agentName": "tick", "limit": 1}
        first_page = alice.get("/v1/runs", params=ticks).json()
        assert [r["id"] for r in first_page["items"]] == [second]
        rest = alice.get("/v1/runs", params={**ticks, "cursor": first_page["nextCursor"]})
        assert [r["id"] for r in rest.json()["items"]] == [run["id"]]
        # A client's Idempotency-Key in the schedules' namespace would take a fire time's run.
        fire_key = {"Idempotency-Key": f"schedule|nightly|{got['nextFireAt']}"}
        stolen = alice.post("/v1/runs", json={"agentName": "tick"}, headers=fire_key)
        assert stolen.status_code == 422 and "schedule|" in stolen.json()["detail"]
        assert len(alice.get("/v1/runs", params={"limit": 200}).json()["items"]) == 4
        paused = alice.put(
            "/v1/schedules/nightly", json={**body, "agentName": "tock", "paused": True}
        ).json()
        assert paused["paused"] and paused["nextFireAt"] is None
        assert [s["name"] for s in alice.get("/v1/schedules").json()["items"]] == ["nightly"]
        assert alice.delete("/v1/schedules/nightly").status_code == 204
        assert alice.get("/v1/schedules/nightly").status_code == 404


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"agentName": "tick", "cron": "0 25 * * *"}, 422, "cron"),
        ({"agentName": "tick", "cron": "0 6 * * *", "timezone": "Europe/Atlantis"}, 422, "IANA"),
        ({"agentName": "tick", "every": "0.5s"}, 422, "at least 1s"),
        ({"agentName": "tick", "every": "soon"}, 422, "Go duration"),
        ({"agentName": "tick", "every": "1s", "cron": "* * * * *"}, 422, "exactly one"),
        ({"agentName": "tick", "every": "1s", "catchup": "some"}, 422, "catchup"),
        ({"agentName": "nobody", "every": "1s"}, 404, "nobody"),
        ([1, 2], 422, ""),
    ],
)
def test_hostile_input_is_a_problem_and_changes_nothing(
    api_server: Server, body: Any, status: int, says: str
) -> None:
    with client(api_server, "alice") as alice:
        alice.put("/v1/agents/tick", json=TICK)
        answer = alice.put("/v1/schedules/s", json=body)
        assert answer.status_code == status, answer.text
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert says in answer.text
        assert alice.get("/v1/schedules").json()["items"] == []
        bad_name = alice.put("/v1/schedules/..%20x", json={"agentName": "tick", "every": "1s"})
        assert bad_name.status_code == 422
        assert alice.post("/v1/schedules/none/trigger").status_code == 404
