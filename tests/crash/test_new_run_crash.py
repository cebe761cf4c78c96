"""A run stored with its opening in one commit (``POST /v1/runs?wait=`` on a replica with a
free slot, lantern/engine/new_run.py) survives a SIGKILL right after that commit.

The killed replica leaves the run running under its lease with ``run_started`` and its first
step's ``step_started`` journaled, and nothing invoked; the recovery sweep of a replica started
after it takes it back once the lease expires, and its step runs once. Each killed replica
first drives a run of both agents (the version a run's opening is made for is the newest one
it drove), so the killed create is one stored with its opening. The two openings that store a
run this way are tested: a code-first run's (``FunctionDrive.begin``) and a graph's
(``Drive.begin``, which a plain LLM agent's run opens with too). A microVM run is never stored
this way (the runtime scheduler places it once it is queued).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from lantern.demo.receiver import Receiver
from tests.server import ALL_SCOPES, Server, make_key

APP = "tests.crash.code_app:app"
PINGS = {
    "name": "pings",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {
                "id": "p",
                "type": "tool",
                "data": {"tool": "ping", "args": {"url": "{{ input.url }}"}},
            },
        ],
        "edges": [{"source": "start", "target": "p"}],
    },
}
FAST = {"LANTERN_LEASE_TTL": "2s", "LANTERN_RECOVERY_INTERVAL": "500ms"}


def create(api: httpx.Client, agent: str, url: str, key: str) -> httpx.Response:
    body = {"agentName": agent, "input": {"url": url}}
    return api.post("/v1/runs", params={"wait": 30}, json=body, headers={"Idempotency-Key": key})


@pytest.mark.timeout(180)
def test_a_run_killed_right_after_its_create_and_opening_commit_is_finished_once(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    key = make_key(database_url, "default", ALL_SCOPES)
    headers = {"Authorization": f"Bearer {key}"}
    crashes = {"LANTERN_TEST_CRASH_AFTER": "run_started:", "LANTERN_TEST_CRASH_SKIP": "2", **FAST}
    killed = {}
    for n, (agent, path) in enumerate((("opens", "/code"), ("pings", "/graph"))):
        server = Server(database_url, tmp_path / f"a{n}.log", env=crashes, app=APP).start()
        try:
            with httpx.Client(base_url=server.url, headers=headers, timeout=60) as api:
                api.put("/v1/agents/pings", json=PINGS).raise_for_status()
                # A replica opens a run with its create once it drove the agent's version:
                # one run of each kind first (the two commits the hook lets through).
                for warm in ("opens", "pings"):
                    made = create(api, warm, f"{receiver.url}/warm-{warm}-{n}", f"w-{warm}-{n}")
                    assert made.status_code == 200 and made.json()["status"] == "succeeded"
                with pytest.raises(httpx.TransportError):  # killed by its opening commit
                    create(api, agent, f"{receiver.url}{path}", f"crash-{agent}")
            assert server.proc is not None and server.proc.wait(10) == -9
            killed[agent] = path
        finally:
            if server.proc is not None and server.proc.poll() is None:
                server.proc.kill()

    other = Server(database_url, tmp_path / "b.log", env=FAST, app=APP).start()
    try:
        with httpx.Client(base_url=other.url, headers=headers, timeout=60) as api:
            for agent, path in killed.items():
                # The same create again: the run the killed replica stored, finished by the
                # sweep of a replica started after it (the next killed one's, or this one's).
                run = create(api, agent, f"{receiver.url}{path}", f"crash-{agent}").json()
                if run["status"] != "succeeded":
                    run = api.get(f"/v1/runs/{run['id']}", params={"wait": 30}).json()
                assert run["status"] == "succeeded", (agent, run)
                events = api.get(f"/v1/runs/{run['id']}/events").json()["items"]
                kinds = [e["kind"] for e in events]
                assert kinds.count("run_started") == 1 and kinds.count("run_recovered") == 1, kinds
                hits = receiver.count(path if agent == "pings" else f"{path}/s1")
                assert hits == 1, (agent, hits)  # started before the kill, invoked once after
            listed: list[dict[str, Any]] = api.get("/v1/runs", params={"limit": 100}).json()[
                "items"
            ]
            assert len(listed) == 6  # two warm-ups per killed replica, and one run each
    finally:
        other.stop()
