"""A rate limit holds a fleet (docs/rate-limits.md): 20 model runs (graph, plain agent and
code-first) on two `lantern serve` replicas sharing PostgreSQL, against a fake provider that
counts what it is sent. In every window the tokens and requests it answered stay within the
limit, no run fails, and the runs that waited journaled ``step_throttled``.

The limit is small so that the 20 runs need two windows. The window is 20 s here
(``LANTERN_RATE_LIMIT_WINDOW``; a minute by default), so the test does not wait out a minute;
a wait longer than that window would mean the setting was not applied."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from lantern.models.throttle import SLOTS
from tests.fake_llm import FakeProvider, Script
from tests.integration.test_rate_limits import GRAPH, PLAIN
from tests.server import ALL_SCOPES, Server, make_key

TOKENS, REQUESTS = 330, 14
WINDOW_S = 20
SLOT_MS = round(WINDOW_S * 1000 / 60)  # lantern.models.throttle's slot for this window


@pytest.fixture
def fleet(pg_url: str, tmp_path: Path) -> Iterator[tuple[FakeProvider, list[Server]]]:
    fake = FakeProvider(script=Script(["Hi."])).start()
    app = "tests.integration.rate_limit_app:app"
    env = {**fake.env(), "LANTERN_RATE_LIMIT_WINDOW": f"{WINDOW_S}s"}
    servers = [Server(pg_url, tmp_path / f"serve{i}.log", env=env, app=app) for i in range(2)]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda s: s.start(), servers))
    yield fake, servers
    for s in servers:
        s.stop()
    fake.close()


@pytest.mark.timeout(240)
def test_twenty_runs_on_two_replicas_stay_within_the_limit_in_every_minute(
    fleet: tuple[FakeProvider, list[Server]],
) -> None:
    fake, servers = fleet
    key = make_key(servers[0].database_url, "acme", ALL_SCOPES + ",admin")
    auth = {"Authorization": f"Bearer {key}"}
    a, b = (httpx.Client(base_url=s.url, headers=auth, timeout=60) for s in servers)
    with a, b:
        limit = {
            "match": {"model": "openai/*"},
            "tokensPerMinute": TOKENS,
            "requestsPerMinute": REQUESTS,
        }
        assert a.put("/v1/limits/openai", json=limit).status_code == 200
        assert a.put("/v1/agents/graph", json=GRAPH).status_code == 200
        assert a.put("/v1/agents/plain", json=PLAIN).status_code == 200
        ids = []
        for n in range(20):
            kind = ("graph", "plain", "code")[n % 3]
            body = f"Say hi to Ada {n}" if kind == "plain" else {"who": f"Ada {n}"}
            client = (a, b)[n % 2]
            created = client.post("/v1/runs", json={"agentName": kind, "input": body})
            assert created.status_code == 202, created.text
            ids.append(created.json()["id"])
        runs = []
        for run_id in ids:
            for _ in range(10):
                run = a.get(f"/v1/runs/{run_id}", params={"wait": 30}).json()
                if run["status"] in ("succeeded", "failed", "cancelled"):
                    break
            runs.append(run)
        throttled = []
        for run_id in ids:
            events = b.get(f"/v1/runs/{run_id}/events").json()["items"]
            throttled += [e["data"] for e in events if e["kind"] == "step_throttled"]
    assert [r["status"] for r in runs] == ["succeeded"] * 20, [r["error"] for r in runs]
    tokens, requests = fake.window_peak(WINDOW_S)
    assert requests <= REQUESTS and tokens <= TOKENS, (tokens, requests)
    assert len(fake.calls()) == 20  # each run's one call, sent once
    assert throttled and {t["limit"] for t in throttled} == {"openai"}
    assert all(0 < t["waitMs"] <= SLOTS * SLOT_MS + 1000 for t in throttled)
