"""Retention's cost to runs in flight, its deletion rate, and what a 10-step run keeps.

On each backend: ``--runs`` finished runs of 10 steps are stored (their journals written as a
drive writes them: run_started, step_started/step_completed per step, run_succeeded), and the
database's growth per run is printed. Then ``--writers`` runs in flight commit their steps (a
step_started and a step_completed per step, each a fenced append under the run's lease, the
commits a drive makes per step) for ``--seconds``, first alone and then beside a retention pass
deleting the finished runs 20 per transaction; the per-step p99 of the two phases and their
ratio are printed (target: at most 1.5), and the rows deleted per second.

    .venv/bin/python bench/retention.py [--runs 2000] [--writers 8] [--backends sqlite,postgres]

The issue's scale is ``--runs 100000``. ``LANTERN_BENCH_PG_URL`` overrides the PostgreSQL URL;
PostgreSQL runs in a fresh schema dropped at the end, SQLite in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import tempfile
import time
from pathlib import Path

import psycopg

from lantern.engine import events as ev
from lantern.engine.journal import EventWriter
from lantern.engine.retention import retention_pass
from lantern.engine.runs import create_run
from lantern.store import Store, open_store
from lantern.store.records import Append, Lease, RunUpdate

PG = os.environ.get("LANTERN_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
AGENT = {"name": "b", "graph": {"nodes": [{"id": "start", "type": "trigger"}], "edges": []}}


async def finished_run(store: Store) -> None:
    run = await create_run(store, "b", {"n": 1})
    w = EventWriter(run.id)
    events = [w.event(ev.RUN_STARTED)]
    for k in range(1, 11):
        events.append(w.event(ev.STEP_STARTED, step_id=f"t{k}", attempt=1))
        events.append(w.completed(f"t{k}", 1, {"ok": True, "step": k}))
    events.append(w.event(ev.RUN_SUCCEEDED, {"output": {"ok": True}}))
    assert await store.start_run(run.id, "bench", 60, events, RunUpdate("succeeded"))


async def writer(store: Store, stop: asyncio.Event, latencies: list[float]) -> None:
    """One run in flight after another, each 10 steps of two fenced appends."""
    while not stop.is_set():
        run = await create_run(store, "b", {"n": 1})
        w = EventWriter(run.id)
        lease = await store.start_run(
            run.id, "bench-live", 60, [w.event(ev.RUN_STARTED)], RunUpdate("running")
        )
        assert isinstance(lease, Lease)
        for k in range(1, 11):
            begun = time.perf_counter()
            started = w.event(ev.STEP_STARTED, step_id=f"t{k}", attempt=1)
            await store.append(Append(lease, (started,), None))
            done = w.completed(f"t{k}", 1, {"ok": True})
            await store.append(Append(lease, (done,), None))
            latencies.append(time.perf_counter() - begun)
        end = w.event(ev.RUN_SUCCEEDED, {"output": None})
        await store.append(Append(lease, (end,), RunUpdate("succeeded")))


async def phase(store: Store, writers: int, seconds: float, delete: bool) -> tuple[float, float]:
    """Per-step p99 (ms) of the runs in flight, and rows deleted per second."""
    stop = asyncio.Event()
    latencies: list[float] = []
    tasks = [asyncio.create_task(writer(store, stop, latencies)) for _ in range(writers)]
    rows, begun = 0, time.perf_counter()
    if delete:
        while time.perf_counter() - begun < seconds:
            result = await retention_pass(store, 0.001, max_runs=200)
            rows += result.rows
            if not result.runs:
                break
    spent = time.perf_counter() - begun
    await asyncio.sleep(max(0.0, seconds - spent))
    stop.set()
    await asyncio.gather(*tasks)
    p99 = statistics.quantiles(latencies, n=100)[98] * 1000
    return p99, rows / spent if delete else 0.0


async def bench(url: str, name: str, runs: int, writers: int, seconds: float) -> None:
    store = open_store(url)
    await store.open()
    try:
        await store.put_agent("default", "b", AGENT)
        before = (await store.storage_gauges()).database_bytes or 0
        for _ in range(runs):
            await finished_run(store)
        after = (await store.storage_gauges()).database_bytes or 0
        print(f"{name}: {runs} finished 10-step runs, {(after - before) / runs:,.0f} bytes each")
        alone, _ = await phase(store, writers, seconds, delete=False)
        await store.set_workspace_retention("default", 0.001)
        beside, rate = await phase(store, writers, seconds, delete=True)
        print(
            f"{name}: per-step p99 of {writers} runs in flight: {alone:.2f} ms alone,"
            f" {beside:.2f} ms beside deletion (ratio {beside / alone:.2f}, target <= 1.5);"
            f" {rate:,.0f} rows deleted per second"
        )
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args()
    backends = args.backends.split(",")
    if "sqlite" in backends:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{Path(tmp) / 'bench.db'}"
            await bench(url, "sqlite", args.runs, args.writers, args.seconds)
    if "postgres" in backends:
        schema = f"bench_{secrets.token_hex(4)}"
        try:
            admin = await psycopg.AsyncConnection.connect(PG, autocommit=True)
        except psycopg.OperationalError as exc:
            print(f"postgres: skipped ({exc})")
            return
        await admin.execute(f"CREATE SCHEMA {schema}")
        sep = "&" if "?" in PG else "?"
        try:
            url = f"{PG}{sep}options=-csearch_path%3D{schema}"
            await bench(url, "postgres", args.runs, args.writers, args.seconds)
        finally:
            await admin.execute(f"DROP SCHEMA {schema} CASCADE")
            await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
