"""Two `lantern serve` replicas on PostgreSQL fire a 1 s schedule; one is SIGKILLed: no fire
time has two runs, and at most one is missed around the kill (docs/schedules.md). A fire is
a run created under its key whatever the agent's kind (graph, plain, code-first, microVM),
so a graph agent stands for all four."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path

import httpx

from tests.server import ALL_SCOPES, Server, make_key

TICK = {"name": "tick", "graph": {"nodes": [{"id": "start", "type": "trigger"}], "edges": []}}
ENV = {"LANTERN_RECOVERY_INTERVAL": "1s", "LANTERN_LEASE_TTL": "3s"}


def test_a_replica_killed_neither_doubles_nor_loses_fires(pg_url: str, tmp_path: Path) -> None:
    with ThreadPoolExecutor(2) as pool:  # the two start at once: half the wait
        a, b = pool.map(
            lambda n: Server(pg_url, tmp_path / f"{n}.log", env=ENV).start(), ["a", "b"]
        )
    try:
        key = make_key(pg_url, "default", ALL_SCOPES)
        with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
            assert http.put(f"{a.url}/v1/agents/tick", json=TICK).status_code == 200
            body = {"agentName": "tick", "every": "1s", "overlap": "allow"}
            assert http.put(f"{a.url}/v1/schedules/beat", json=body).status_code == 200
            time.sleep(3)
            a.kill()  # SIGKILL
            time.sleep(3)
            runs = http.get(f"{b.url}/v1/runs", params={"schedule": "beat", "limit": 200}).json()[
                "items"
            ]
            times = [
                datetime.fromisoformat(
                    http.get(f"{b.url}/v1/runs/{r['id']}").json()["schedule"]["fireTime"]
                )
                for r in runs
            ]
    finally:
        for s in (a, b):
            if s.proc is not None and s.proc.poll() is None:
                s.stop()
    assert len(times) == len(set(times)), "a fire time started two runs"
    times.sort()
    assert len(times) >= 4
    seconds = {t.replace(microsecond=0) for t in times}
    span = int((times[-1] - times[0]).total_seconds()) + 1
    missed = [
        times[0] + timedelta(seconds=k)
        for k in range(span)
        if times[0] + timedelta(seconds=k) not in seconds
    ]
    assert len(missed) <= 1, f"missed {missed}"
