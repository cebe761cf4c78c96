"""Signal latency on a real `lantern serve`, beside an approval's (the same park and wake).

For each backend: ``--runs`` graph runs parked at a ``signal`` node and as many parked at an
``approval``, interleaved; each is resumed in turn (``POST .../signals/go`` or
``.../approvals/ok``) and waited for with ``GET ?wait=``. Prints, per kind, the p50/p99 of the
202 (the signal or decision stored) and of the send -> run succeeded (woken, claimed,
re-driven, finished), and the ratio of the two kinds' medians: one host, one run, so load on
the machine moves both alike.

    .venv/bin/python bench/signals.py [--runs 40] [--database-url postgresql://...]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.server import ALL_SCOPES, Server, make_key


def agent(name: str, node: dict[str, object]) -> dict[str, object]:
    nodes = [{"id": "start", "type": "trigger"}, node]
    return {"name": name, "graph": {"nodes": nodes, "edges": [{"source": "start", "target": "w"}]}}


SIGNAL = agent("sig", {"id": "w", "type": "signal", "data": {"name": "go"}})
APPROVAL = agent("appr", {"id": "w", "type": "approval", "data": {"prompt": "go?"}})


def ms(values: list[float]) -> str:
    got = sorted(v * 1000 for v in values)
    p99 = got[min(len(got) - 1, round(0.99 * (len(got) - 1)))]
    return f"p50 {statistics.median(got):7.1f} ms  p99 {p99:7.1f} ms"


def parked(http: httpx.Client, run_id: str) -> None:
    deadline = time.monotonic() + 60
    while http.get(f"/v1/runs/{run_id}").json()["status"] != "waiting":
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run_id} never parked")
        time.sleep(0.02)


def measure(database_url: str, tmp: Path, runs: int) -> None:
    server = Server(database_url, tmp / "serve.log").start()
    key = make_key(database_url, "default", ALL_SCOPES)
    times: dict[str, tuple[list[float], list[float]]] = {"signal": ([], []), "approval": ([], [])}
    try:
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=60) as http:
            http.put("/v1/agents/sig", json=SIGNAL).raise_for_status()
            http.put("/v1/agents/appr", json=APPROVAL).raise_for_status()
            ids = []
            for _ in range(runs):
                for name in ("sig", "appr"):
                    ids.append(http.post("/v1/runs", json={"agentName": name}).json()["id"])
            for run_id in ids:
                parked(http, run_id)
            for i, run_id in enumerate(ids):
                kind = "signal" if i % 2 == 0 else "approval"
                path, body = (
                    (f"/v1/runs/{run_id}/signals/go", {"payload": {"i": i}})
                    if kind == "signal"
                    else (f"/v1/runs/{run_id}/approvals/w", {"decision": "approve"})
                )
                started = time.perf_counter()
                answer = http.post(path, json=body)
                stored = time.perf_counter()
                answer.raise_for_status()
                while http.get(f"/v1/runs/{run_id}", params={"wait": 30}).json()["status"] != (
                    "succeeded"
                ):
                    pass
                times[kind][0].append(stored - started)
                times[kind][1].append(time.perf_counter() - started)
    finally:
        server.stop()
    backend = database_url.split(":", 1)[0]
    for kind, (accepted, resumed) in times.items():
        print(f"{backend:<10} {kind:<8} 202 {ms(accepted)}   send->succeeded {ms(resumed)}")
    ratio = statistics.median(times["signal"][1]) / statistics.median(times["approval"][1])
    print(f"{backend:<10} signal/approval, send->succeeded medians: {ratio:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    with TemporaryDirectory() as folder:
        tmp = Path(folder)
        measure(f"sqlite:///{tmp / 'bench.db'}", tmp, args.runs)
        schema = f"bench_{secrets.token_hex(4)}"
        with psycopg.connect(args.database_url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        try:
            measure(f"{args.database_url}?options=-csearch_path%3D{schema}", tmp, args.runs)
        finally:
            with psycopg.connect(args.database_url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()
