"""Open streams per API key (LANTERN_STREAMS_PER_KEY: 32 here, 256 by default) on a real
`lantern serve`: `/stream` connections and `?wait=` long-polls count together; one more
answers 429 with Retry-After, and /healthz and another workspace keep answering within a
second throughout."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.hostile.kit import Tenant, attack
from tests.server import Server

SCOPES = "runs:execute,runs:read,agents:write,agents:read"
PARKED = {
    "name": "parked",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "ok", "type": "approval", "data": {"prompt": "go?"}},
        ],
        "edges": [{"source": "start", "target": "ok"}],
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp("streams")
    # The limit works the same at any setting: 32 keeps the test's connections few.
    env = {"LANTERN_STREAMS_PER_KEY": "32"}
    server = Server(f"sqlite:///{tmp / 'lantern.db'}", tmp / "serve.log", env=env).start()
    yield server
    server.stop()


def parked_run(tenant: Tenant) -> str:
    assert tenant.apply(PARKED).status_code == 200
    run_id = tenant.start("parked")
    deadline = time.monotonic() + 20
    while tenant.http.get(f"/v1/runs/{run_id}").json()["status"] != "waiting":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return run_id


def test_33_streams_on_one_key(server: Server) -> None:
    greedy, other = Tenant(server, "greedy", SCOPES), Tenant(server, "other", SCOPES)
    mine, theirs = parked_run(greedy), parked_run(other)
    headers = dict(greedy.http.headers)
    limits = httpx.Limits(max_connections=100)
    slow: list[float] = []
    try:
        with (
            attack(server, "streams", 34),
            httpx.Client(base_url=server.url, headers=headers, limits=limits, timeout=30) as c,
            ExitStack() as open_,
        ):
            for _ in range(31):
                r = open_.enter_context(c.stream("GET", f"/v1/runs/{mine}/stream"))
                assert r.status_code == 200
            # The 32nd is a long-poll, held on a thread.
            polled: list[httpx.Response] = []
            poll = threading.Thread(
                target=lambda: polled.append(c.get(f"/v1/runs/{mine}/events?after=999&wait=3"))
            )
            poll.start()
            time.sleep(0.5)
            over = [c.get(f"/v1/runs/{mine}/stream"), c.get(f"/v1/runs/{mine}?wait=2")]
            for r in over:
                assert r.status_code == 429, r.text
                assert r.headers["content-type"].startswith("application/problem+json")
                assert int(r.headers["Retry-After"]) >= 1
                assert "LANTERN_STREAMS_PER_KEY" in r.json()["detail"]
            # Another workspace is not refused, nor slowed.
            for _ in range(5):
                started = time.monotonic()
                assert other.http.get(f"/v1/runs/{theirs}").status_code == 200
                s = other.http.get(f"/v1/runs/{theirs}/events?after=999&wait=0.1")
                assert s.status_code == 200
                slow.append(time.monotonic() - started)
            poll.join(10)
            assert polled and polled[0].status_code == 200
            # The long-poll's slot came back: one stream more fits, then no more.
            with c.stream("GET", f"/v1/runs/{mine}/stream") as again:
                assert again.status_code == 200
                assert c.get(f"/v1/runs/{mine}/stream").status_code == 429
        assert max(slow) < 1.0, slow
        # Every stream closed by its client gave its slot back.
        deadline = time.monotonic() + 10
        while True:
            with greedy.http.stream("GET", f"/v1/runs/{mine}/stream") as r:
                if r.status_code == 200:
                    break
            assert time.monotonic() < deadline, "closed streams kept their slots"
            time.sleep(0.2)
    finally:
        greedy.close()
        other.close()
