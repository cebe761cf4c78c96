"""Schedule fire latency (due time -> run created), p50/p99, on PostgreSQL.

Two real `lantern serve` replicas on a fresh schema share one ``every 1s`` schedule (overlap
``allow``). Phase 1: both up for ``--seconds``; phase 2: one SIGKILLed, the other alone for
``--seconds``. Latency of a fire = the run's ``createdAt`` - its ``schedule.fireTime`` (one
host, one clock). Prints each phase's p50, p99 and count, and any fire time missed.

    .venv/bin/python bench/schedules.py [--seconds 10] [--database-url postgresql://...]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.server import ALL_SCOPES, Server, make_key

TICK = {"name": "tick", "graph": {"nodes": [{"id": "start", "type": "trigger"}], "edges": []}}
ENV = {"LANTERN_RECOVERY_INTERVAL": "1s", "LANTERN_LEASE_TTL": "3s"}


def fires(http: httpx.Client, url: str) -> list[tuple[datetime, float]]:
    runs = http.get(f"{url}/v1/runs", params={"schedule": "beat", "limit": 200}).json()["items"]
    out = []
    for r in runs:
        got = http.get(f"{url}/v1/runs/{r['id']}").json()
        due = datetime.fromisoformat(got["schedule"]["fireTime"])
        out.append((due, (datetime.fromisoformat(got["createdAt"]) - due).total_seconds()))
    return sorted(out)


def report(name: str, lat: list[float]) -> None:
    ms = sorted(x * 1000 for x in lat)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    print(f"{name:<28} n={len(ms):3d}  p50 {statistics.median(ms):7.1f} ms  p99 {p99:7.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    schema = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    url = f"{args.database_url}?options=-csearch_path%3D{schema}"
    try:
        with TemporaryDirectory() as tmp:
            a = Server(url, Path(tmp) / "a.log", env=ENV).start()
            b = Server(url, Path(tmp) / "b.log", env=ENV).start()
            key = make_key(url, "default", ALL_SCOPES)
            with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
                http.put(f"{a.url}/v1/agents/tick", json=TICK).raise_for_status()
                body = {"agentName": "tick", "every": "1s", "overlap": "allow"}
                http.put(f"{a.url}/v1/schedules/beat", json=body).raise_for_status()
                time.sleep(args.seconds)
                a.kill()
                killed = datetime.now().astimezone()
                time.sleep(args.seconds)
                found = fires(http, b.url)
            b.stop()
    finally:
        with psycopg.connect(args.database_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    report("two replicas up", [lat for due, lat in found if due < killed])
    report("after one was SIGKILLed", [lat for due, lat in found if due >= killed])
    seconds = {due for due, _ in found}
    span = int((found[-1][0] - found[0][0]).total_seconds()) + 1
    print(f"fire times {len(found)} of {span}; duplicates {len(found) - len(seconds)}")


if __name__ == "__main__":
    main()
