"""Two `lantern serve` replicas on PostgreSQL fire 1 s schedules of a graph, a plain and a
code-first agent; one replica is SIGKILLed: no fire time has two runs, at most one is missed
around the kill, and every run fired, the killed replica's included, completes under its fire
time's key (docs/schedules.md). A microVM agent's schedule needs a runtime node:
tests/runtime/test_runtime_ha.py fires one on PostgreSQL, test_microvm_guarantees.py on SQLite."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from tests.schedule_kinds import check_fired, define
from tests.server import ALL_SCOPES, Server, make_key

ENV = {"LANTERN_RECOVERY_INTERVAL": "1s", "LANTERN_LEASE_TTL": "3s"}
KINDS = ("graph", "plain", "code")
APP = "tests.runtime.guard_app:app"  # its code-first agent tick-code


def test_a_replica_killed_neither_doubles_nor_loses_fires(pg_url: str, tmp_path: Path) -> None:
    def started(n: str) -> Server:
        return Server(pg_url, tmp_path / f"{n}.log", env=ENV, app=APP).start()

    with ThreadPoolExecutor(2) as pool:  # the two start at once: half the wait
        a, b = pool.map(started, ["a", "b"])
    fired: dict[str, list[dict[str, Any]]] = {}
    try:
        key = make_key(pg_url, "default", ALL_SCOPES)
        with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=90) as http:

            def put(path: str, body: Any) -> None:
                assert http.put(f"{a.url}{path}", json=body).status_code == 200

            for kind in KINDS:
                define(put, kind, f"beat-{kind}", every="1s", overlap="allow")
            time.sleep(3)
            a.kill()  # SIGKILL
            time.sleep(3)
            for kind in KINDS:
                assert http.delete(f"{b.url}/v1/schedules/beat-{kind}").status_code == 204
                listed = http.get(
                    f"{b.url}/v1/runs", params={"schedule": f"beat-{kind}", "limit": 200}
                ).json()["items"]
                # A run the killed replica held is taken over once its lease expires.
                fired[kind] = [
                    http.get(f"{b.url}/v1/runs/{r['id']}", params={"wait": 30}).json()
                    for r in listed
                ]
    finally:
        for s in (a, b):
            if s.proc is not None and s.proc.poll() is None:
                s.stop()
    for kind, runs in fired.items():
        check_fired(pg_url, f"beat-{kind}", runs)
        times = sorted(datetime.fromisoformat(r["schedule"]["fireTime"]) for r in runs)
        assert len(times) >= 4, kind
        seconds = {t.replace(microsecond=0) for t in times}
        span = int((times[-1] - times[0]).total_seconds()) + 1
        missed = [
            times[0] + timedelta(seconds=k)
            for k in range(span)
            if times[0] + timedelta(seconds=k) not in seconds
        ]
        assert len(missed) <= 1, f"{kind}: missed {missed}"
