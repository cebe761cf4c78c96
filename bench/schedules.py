"""Schedule fire latency (due time -> run created), p50/p99, on PostgreSQL, before and after
a replica is lost.

Real `lantern serve` replicas on a fresh schema share one ``every 1s`` schedule (overlap
``allow``). Phase 1: one replica alone for ``--seconds``; phase 2: a second one joins, both up
for ``--seconds``; phase 3: the first is SIGKILLed, the second alone for ``--seconds``. Latency
of a fire = the run's ``createdAt`` - its ``schedule.fireTime`` (one host, one clock). Prints
each phase's p50, p99 and count, the fires of the first 3 s after the kill apart (the contract
bounds a fire's lateness after a replica dies by ``LANTERN_RECOVERY_INTERVAL``; 3 s is the lease
TTL, past which the killed replica's runs are taken over too), any fire time missed or doubled,
and the load average (the machine is shared: read the figures beside it).

    .venv/bin/python bench/schedules.py [--seconds 20] [--database-url postgresql://...]
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.server import ALL_SCOPES, Server, make_key

TICK = {"name": "tick", "graph": {"nodes": [{"id": "start", "type": "trigger"}], "edges": []}}
ENV = {"LANTERN_RECOVERY_INTERVAL": "1s", "LANTERN_LEASE_TTL": "3s"}
RIGHT_AFTER = timedelta(seconds=3)  # the lease TTL


def fires(http: httpx.Client, url: str) -> list[tuple[datetime, float]]:
    out = []
    params: dict[str, str | int] = {"schedule": "beat", "limit": 200}
    while True:
        page = http.get(f"{url}/v1/runs", params=params).json()
        for r in page["items"]:
            got = http.get(f"{url}/v1/runs/{r['id']}").json()
            due = datetime.fromisoformat(got["schedule"]["fireTime"])
            out.append((due, (datetime.fromisoformat(got["createdAt"]) - due).total_seconds()))
        if not page.get("nextCursor"):
            return sorted(out)
        params["cursor"] = page["nextCursor"]


def report(name: str, lat: list[float]) -> None:
    if not lat:
        print(f"{name:<40} n=  0")
        return
    ms = sorted(x * 1000 for x in lat)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    print(
        f"{name:<40} n={len(ms):3d}  p50 {statistics.median(ms):7.1f} ms"
        f"  p99 {p99:7.1f} ms  max {ms[-1]:7.1f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    schema = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    url = f"{args.database_url}?options=-csearch_path%3D{schema}"
    load = [os.getloadavg()[0]]
    try:
        with TemporaryDirectory() as tmp:
            a = Server(url, Path(tmp) / "a.log", env=ENV).start()
            key = make_key(url, "default", ALL_SCOPES)
            with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
                http.put(f"{a.url}/v1/agents/tick", json=TICK).raise_for_status()
                body = {"agentName": "tick", "every": "1s", "overlap": "allow"}
                http.put(f"{a.url}/v1/schedules/beat", json=body).raise_for_status()
                time.sleep(args.seconds)
                joining = datetime.now(UTC)
                b = Server(url, Path(tmp) / "b.log", env=ENV).start()
                joined = datetime.now(UTC)  # fires while it started are counted in neither
                load.append(os.getloadavg()[0])
                time.sleep(args.seconds)
                a.kill()  # SIGKILL
                killed = datetime.now(UTC)
                load.append(os.getloadavg()[0])
                time.sleep(args.seconds)
                load.append(os.getloadavg()[0])
                found = fires(http, b.url)
            b.stop()
    finally:
        with psycopg.connect(args.database_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    soon = killed + RIGHT_AFTER
    report("one replica up", [lat for due, lat in found if due < joining])
    report("two replicas up", [lat for due, lat in found if joined <= due < killed])
    report("after one was SIGKILLed (all)", [lat for due, lat in found if due >= killed])
    report("  of which the first 3 s", [lat for due, lat in found if killed <= due < soon])
    seconds = {due for due, _ in found}
    span = int((found[-1][0] - found[0][0]).total_seconds()) + 1
    print(f"fire times {len(seconds)} of {span}; duplicates {len(found) - len(seconds)}")
    loads = " / ".join(f"{x:.1f}" for x in load)
    print(f"load average (1 min) at start / join / kill / end: {loads}")


if __name__ == "__main__":
    main()
