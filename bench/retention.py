"""Retention's cost to runs in flight, its deletion rate, and what a 10-step run keeps.

On each backend: ``--runs`` finished runs of 10 steps are stored (their journals written as a
drive writes them: run_started, step_started/step_completed per step, run_succeeded), and the
database's growth per run is printed. Then ``--writers`` runs in flight commit their steps (a
step_started and a step_completed per step, each a fenced append under the run's lease, the
commits a drive makes per step) while retention passes (of 200 runs, 20 per transaction)
delete the finished runs in every other ``--slice`` seconds until none is left: the per-step
p99 of the slices without and with deletion and their ratio are printed (target: at most
1.5), and the rows deleted per second of deletion. Alternating slices keep a change of the
machine's load from weighing on one side only.

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
from collections.abc import Callable
from dataclasses import dataclass, field
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


async def writer(store: Store, stop: asyncio.Event, latencies: Callable[[], list[float]]) -> None:
    """One run in flight after another, each 10 steps of two fenced appends; a step's latency
    goes to the list of the slice it started in."""
    while not stop.is_set():
        run = await create_run(store, "b", {"n": 1})
        w = EventWriter(run.id)
        lease = await store.start_run(
            run.id, "bench-live", 60, [w.event(ev.RUN_STARTED)], RunUpdate("running")
        )
        assert isinstance(lease, Lease)
        for k in range(1, 11):
            into, begun = latencies(), time.perf_counter()
            started = w.event(ev.STEP_STARTED, step_id=f"t{k}", attempt=1)
            await store.append(Append(lease, (started,), None))
            done = w.completed(f"t{k}", 1, {"ok": True})
            await store.append(Append(lease, (done,), None))
            into.append(time.perf_counter() - begun)
        end = w.event(ev.RUN_SUCCEEDED, {"output": None})
        await store.append(Append(lease, (end,), RunUpdate("succeeded")))


@dataclass
class Measured:
    alone: list[float] = field(default_factory=list)  # step latencies, deletion paused
    beside: list[float] = field(default_factory=list)  # step latencies, deletion running
    rows: int = 0
    deleting_s: float = 0.0

    @staticmethod
    def p99(latencies: list[float]) -> float:
        return statistics.quantiles(latencies, n=100)[98] * 1000


async def measure(store: Store, writers: int, slice_s: float) -> Measured:
    """Runs in flight throughout, and retention passes in every other slice of ``slice_s``
    until every finished run is deleted: alone and beside alternate, so a change of the
    machine's load meanwhile weighs on both alike."""
    stop, found = asyncio.Event(), Measured()
    now = [found.alone]
    tasks = [asyncio.create_task(writer(store, stop, lambda: now[0])) for _ in range(writers)]
    left = True
    while left:
        now[0] = found.alone
        await asyncio.sleep(slice_s)
        now[0], begun = found.beside, time.perf_counter()
        while time.perf_counter() - begun < slice_s:
            result = await retention_pass(store, 0.001, max_runs=200)
            found.rows += result.rows
            if not result.full:  # caught up: the runs in flight finish faster than that
                left = False
                break
        found.deleting_s += time.perf_counter() - begun
    stop.set()
    await asyncio.gather(*tasks)
    return found


async def bench(url: str, name: str, runs: int, writers: int, slice_s: float) -> None:
    store = open_store(url)
    await store.open()
    try:
        await store.put_agent("default", "b", AGENT)
        before = (await store.storage_gauges()).database_bytes or 0
        for done in range(0, runs, 8):  # a few at a time: PostgreSQL's pool has room
            await asyncio.gather(*(finished_run(store) for _ in range(min(8, runs - done))))
        after = (await store.storage_gauges()).database_bytes or 0
        print(f"{name}: {runs} finished 10-step runs, {(after - before) / runs:,.0f} bytes each")
        await store.set_workspace_retention("default", 0.001)
        found = await measure(store, writers, slice_s)
        alone, beside = found.p99(found.alone), found.p99(found.beside)
        print(
            f"{name}: per-step p99 of {writers} runs in flight: {alone:.2f} ms alone,"
            f" {beside:.2f} ms beside deletion (ratio {beside / alone:.2f}, target <= 1.5;"
            f" {len(found.alone)} and {len(found.beside)} steps);"
            f" {found.rows / found.deleting_s:,.0f} rows deleted per second"
        )
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--slice", type=float, default=1.0, help="seconds of each slice")
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args()
    backends = args.backends.split(",")
    if "sqlite" in backends:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{Path(tmp) / 'bench.db'}"
            await bench(url, "sqlite", args.runs, args.writers, args.slice)
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
            await bench(url, "postgres", args.runs, args.writers, args.slice)
        finally:
            await admin.execute(f"DROP SCHEMA {schema} CASCADE")
            await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
