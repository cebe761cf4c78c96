"""What a run parked at an approval costs: no task, no lease, a row in the database.

One process, one ``Worker`` (the executor ``lantern serve`` runs), a fresh PostgreSQL schema
(or SQLite with ``--sqlite``). It applies an agent ``trigger -> approval -> tool`` and creates
N runs (default 10,000); the worker drives each to the approval, where the run parks. Printed:
the process's resident memory and its asyncio task count before the runs and with all N
waiting, the live leases held (from ``run_locks``), and the time to park them; then every run
is approved and the time until all N succeeded.

    .venv/bin/python bench/waiting.py [--runs 10000] [--sqlite]

``LANTERN_BENCH_PG_URL`` overrides the PostgreSQL URL; the schema is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import secrets
import tempfile
import time
from pathlib import Path

import psycopg

import lantern
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.store import Store, open_store
from lantern.store.records import Decision

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
AGENT = {
    "name": "gate",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "ok", "type": "approval", "data": {"prompt": "Ship {{ input.n }}?"}},
            {
                "id": "ship",
                "type": "tool",
                "data": {"tool": "noop", "args": {"n": "{{ input.n }}"}},
            },
        ],
        "edges": [{"source": "start", "target": "ok"}, {"source": "ok", "target": "ship"}],
    },
}


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def count(store: Store, status: str) -> int:
    total, cursor = 0, None
    while True:
        page = await store.list_runs("default", status=status, limit=1000, before=cursor)  # type: ignore[arg-type]
        total += len(page)
        if len(page) < 1000:
            return total
        cursor = page[-1].id


async def wait_for(store: Store, status: str, n: int, limit_s: float) -> float:
    start = time.perf_counter()
    while await count(store, status) < n:
        if time.perf_counter() - start > limit_s:
            raise SystemExit(f"only {await count(store, status)} of {n} runs reached {status}")
        await asyncio.sleep(0.5)
    return time.perf_counter() - start


async def bench(url: str, runs: int) -> None:
    app = lantern.App()

    @app.tool("noop")
    async def noop(n: int) -> dict[str, int]:
        return {"n": n}

    store = open_store(url)
    await store.open()
    try:
        await apply_agent(store, AGENT)
        async with Worker(store, app, worker_id="bench", lease_ttl=60, max_concurrent=256) as w:
            serving = asyncio.create_task(w.serve())
            await asyncio.sleep(0.5)
            gc.collect()
            base_rss, base_tasks = rss_mib(), len(asyncio.all_tasks())
            t0 = time.perf_counter()
            ids = [(await create_run(store, "gate", {"n": i})).id for i in range(runs)]
            created = time.perf_counter() - t0
            parked = await wait_for(store, "waiting", runs, limit_s=1800)
            await asyncio.sleep(1)
            gc.collect()
            rss, tasks = rss_mib(), len(asyncio.all_tasks())
            leases = {r for info in await store.list_workers() for r in info.runs}
            print(f"backend             {url.split(':')[0]}")
            print(f"runs                {runs} (created in {created:.1f} s)")
            print(f"parked              all {runs} waiting {parked:.1f} s after the last create")
            print(f"live leases         {len(leases)} held while they wait")
            print(f"asyncio tasks       {base_tasks} before the runs, {tasks} with {runs} waiting")
            print(
                f"resident memory     {base_rss:.1f} MiB before, {rss:.1f} MiB with {runs}"
                f" waiting ({(rss - base_rss) * 1024 / runs:.2f} KiB per waiting run)"
            )
            t0 = time.perf_counter()
            for run_id in ids:
                await store.decide(Decision(run_id, "ok", "approved", "bench"))
            w.wake()
            decided = time.perf_counter() - t0
            resumed = await wait_for(store, "succeeded", runs, limit_s=1800)
            print(
                f"approved            {runs} decisions in {decided:.1f} s; all succeeded"
                f" {resumed:.1f} s later ({runs / (decided + resumed):.0f} runs/s)"
            )
            await w.stop(grace=5)
            await serving
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--sqlite", action="store_true")
    args = parser.parse_args()
    if args.sqlite:
        with tempfile.TemporaryDirectory() as tmp:
            await bench(f"sqlite:///{tmp}/bench.db", args.runs)
        return
    url = os.environ.get("LANTERN_BENCH_PG_URL", DEFAULT_PG_URL)
    schema = f"bench_waiting_{secrets.token_hex(4)}"
    admin = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await admin.execute(f"CREATE SCHEMA {schema}")
    try:
        sep = "&" if "?" in url else "?"
        await bench(f"{url}{sep}options=-csearch_path%3D{schema}", args.runs)
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
