"""What a rate limit costs a model call: reserve + settle, in µs per call, on SQLite and
PostgreSQL, with no limit (the one read every model call now makes), one matching limit, and
three (the workspace's and the server's); and how much of a contended limit 8 concurrent
callers get through (admitted per second, every admission one conditional UPDATE).

CPU time is measured beside wall time (the machine may be shared: compare ratios within one run).

    .venv/bin/python bench/rate_limits.py [--calls 300] [--database-url postgresql://...]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lantern.errors import Throttled
from lantern.models.throttle import Limiter
from lantern.store import Store, open_store
from lantern.store.model_limits import SERVER

BIG = 10**9  # a limit no bench run reaches


async def per_call(store: Store, limits: int, calls: int) -> tuple[float, float]:
    """µs of wall and CPU time per reserve + settle with ``limits`` matching limits."""
    for n in range(limits):
        scope = SERVER if n == limits - 1 and limits > 1 else "bench"
        await store.put_limit(scope, f"l{n}", "openai/*", BIG, BIG)
    limiter = Limiter(store, "bench")
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        held = await limiter.reserve("gpt-4o-mini", 100)
        await held.settle(80)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    for n in range(limits):
        await store.delete_limit(SERVER if n == limits - 1 and limits > 1 else "bench", f"l{n}")
    return wall / calls * 1e6, cpu / calls * 1e6


async def contended(store: Store, seconds: float) -> float:
    """Admissions per second of 8 callers on one limit with room for all of them."""
    await store.put_limit("bench", "hot", "*", BIG, BIG)
    limiter = Limiter(store, "bench")
    admitted = 0
    end = time.monotonic() + seconds

    async def caller() -> None:
        nonlocal admitted
        while time.monotonic() < end:
            try:
                await limiter.reserve("gpt-4o-mini", 10)
                admitted += 1
            except Throttled:  # lost the conditional write SWAPS times in a row
                pass

    await asyncio.gather(*(caller() for _ in range(8)))
    await store.delete_limit("bench", "hot")
    return admitted / seconds


async def bench(name: str, url: str, calls: int) -> None:
    store = open_store(url)
    await store.open()
    try:
        for limits in (0, 1, 3):
            wall, cpu = await per_call(store, limits, calls)
            print(f"{name:<10} {limits} limits   {wall:8.0f} µs/call wall  {cpu:7.0f} µs/call CPU")
        print(f"{name:<10} contended  {await contended(store, 3.0):8.0f} admitted/s (8 callers)")
    finally:
        await store.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    with TemporaryDirectory() as tmp:
        asyncio.run(bench("sqlite", f"sqlite:///{tmp}/bench.db", args.calls))
    schema = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        sep = "&" if "?" in args.database_url else "?"
        url = f"{args.database_url}{sep}options=-csearch_path%3D{schema}"
        asyncio.run(bench("postgres", url, args.calls))
    finally:
        with psycopg.connect(args.database_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()
