"""A SIGKILL while rate limits hold model steps back (docs/rate-limits.md): the runs are
parked with their due times in the store, so a restarted `lantern serve` makes each call at
or after its journaled due time, never sooner, and once, with the attempt's key. Graph, plain
and code-first runs, on both backends, one server pair for the three."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from lantern.ids import idempotency_key
from tests.fake_llm import FakeProvider, Script
from tests.integration.test_rate_limits import GRAPH, PLAIN, STEP, fill_window
from tests.server import ALL_SCOPES, Server, make_key

APP = "tests.integration.rate_limit_app:app"
KINDS = ("graph", "plain", "code")
# Long enough for the kill, and on most machines the restart, to come before the due time, so
# a run claimed early would show; the window's room comes back then for all three calls.
FULL_FOR_S = 6.0


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    provider = FakeProvider(script=Script(["Hi."])).start()
    yield provider
    provider.close()


def events(api: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = api.get(f"/v1/runs/{run_id}/events").json()["items"]
    return items


def test_a_throttled_steps_due_time_survives_a_sigkill(
    database_url: str, tmp_path: Path, fake: FakeProvider
) -> None:
    key = make_key(database_url, "default", ALL_SCOPES + ",admin")
    auth = {"Authorization": f"Bearer {key}"}
    env = {**fake.env(), "LANTERN_WORKER_ID": "throttle-1"}
    first = Server(database_url, tmp_path / "serve.log", env=env, app=APP).start()
    ids: dict[str, str] = {}
    try:
        with httpx.Client(base_url=first.url, headers=auth, timeout=30) as api:
            limit = {"match": {"model": "openai/*"}, "tokensPerMinute": 1000}
            assert api.put("/v1/limits/tpm", json=limit).status_code == 200
            assert api.put("/v1/agents/graph", json=GRAPH).status_code == 200
            assert api.put("/v1/agents/plain", json=PLAIN).status_code == 200
            # Another replica's calls fill the window until FULL_FOR_S from now.
            asyncio.run(fill_window(database_url, "tpm", 990, leaves_in_s=FULL_FOR_S))
            for kind in KINDS:
                body: Any = "Say hi to Ada" if kind == "plain" else {"who": "Ada"}
                created = api.post("/v1/runs", json={"agentName": kind, "input": body})
                assert created.status_code == 202, created.text
                ids[kind] = created.json()["id"]
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                runs = [api.get(f"/v1/runs/{i}").json() for i in ids.values()]
                if all(r["status"] == "waiting" for r in runs):
                    break
                time.sleep(0.05)
            else:
                raise AssertionError(f"not all throttled runs parked: {runs}")
        first.kill()  # every run parked on its rate limit's wait
    finally:
        if first.proc is not None and first.proc.poll() is None:
            first.kill()
    killed_at = time.time() * 1000
    assert fake.calls() == []
    # The window emptied at once: only the journaled due times hold the calls back now.
    asyncio.run(fill_window(database_url, "tpm", 0, leaves_in_s=0.0))

    second = Server(database_url, tmp_path / "serve.log", env=env, app=APP).start()
    try:
        with httpx.Client(base_url=second.url, headers=auth, timeout=30) as api:
            wait = {"wait": 20}
            ended = {k: api.get(f"/v1/runs/{i}", params=wait).json() for k, i in ids.items()}
            journals = {k: events(api, i) for k, i in ids.items()}
    finally:
        second.stop()
    assert {k: r["status"] for k, r in ended.items()} == dict.fromkeys(KINDS, "succeeded"), ended
    keys = sorted(c.key or "" for c in fake.calls())
    assert keys == sorted(idempotency_key(ids[k], STEP[k], 1) for k in KINDS)  # one call each
    for kind, journal in journals.items():
        step = [e for e in journal if e["stepId"] == STEP[kind]]
        kinds = [e["kind"] for e in step]
        assert kinds == ["step_started", "step_throttled", "step_started", "step_completed"]
        assert {e["attempt"] for e in step} == {1}  # the wait spent no attempt
        due = step[1]["data"]["dueAt"]
        assert killed_at < due  # it was killed before the due time...
        started = step[2]["at"]  # ...and the call was made no sooner
        assert _ms(started) >= due - 5, (kind, started, due)


def _ms(at: str) -> float:
    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp() * 1000
