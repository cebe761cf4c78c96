"""N runs in flight on one replica, each waiting on a slow peer: do they all succeed, and what
does a waiting run cost?

One process, one ``Worker`` (the executor ``lantern serve`` runs) with
``max_concurrent = N`` (``LANTERN_MAX_CONCURRENT_RUNS``), a fresh PostgreSQL schema (or SQLite
with ``--sqlite``), and a slow peer in a process of its own (``tests/slow_peer.py``, asyncio)
that answers every request after ``--delay`` seconds (default 2). Two kinds of run:

- ``http``: ``trigger -> call``, an http connector POSTing to the peer (``timeoutMs`` 4x the
  delay);
- ``model``: ``trigger -> draft``, an ai-step on ``gpt-4o-mini`` through the OpenAI SDK, with
  ``OPENAI_BASE_URL`` pointing at the peer (which answers in the chat-completions format).

For each kind and each N (default 500, 2,000, 5,000): the runs are created in-process
(``create_run``), and the bench watches until every run has finished, reading the process's
resident memory while runs wait on the peer. Printed: how many succeeded, the wall time from
the first create to the last run finished, resident memory per waiting run (the most RSS seen
while runs waited, minus RSS before, over the most requests the peer held at once), that most,
and the p50/p99 of the journal commit latency (``lantern_journal_write_seconds``, interpolated
within its buckets). Target: 5,000 in flight,
all succeed, under 50 KiB per waiting run.

    .venv/bin/python bench/concurrency.py [--runs 500,2000,5000] [--kind http,model]
        [--delay 2] [--sqlite] [--pages]

``--pages`` instead times ``GET``-equivalent page reads of a 10,000-event run's journal
(``store.events(after, limit=100)``) at the start and at the end, in microseconds per page.
``LANTERN_BENCH_PG_URL`` overrides the PostgreSQL URL; the schema is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import lantern  # noqa: E402
from lantern.engine.journal import EventWriter  # noqa: E402
from lantern.engine.runs import apply_agent, create_run  # noqa: E402
from lantern.engine.worker import Worker  # noqa: E402
from lantern.observability import metrics  # noqa: E402
from lantern.store import Append, Store, open_store  # noqa: E402

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def agent(kind: str, peer: str, delay: float) -> dict[str, Any]:
    if kind == "http":
        step = {
            "id": "call",
            "type": "connector",
            "data": {
                "connector": "http",
                "url": f"{peer}/hook",
                "body": {"n": "{{ input.n }}"},
                "timeoutMs": int(delay * 4000),
            },
        }
    else:
        step = {
            "id": "call",
            "type": "ai-step",
            "data": {"model": "gpt-4o-mini", "prompt": "Say ok to {{ input.n }}"},
        }
    return {
        "name": f"slow-{kind}",
        "graph": {
            "nodes": [{"id": "start", "type": "trigger"}, step],
            "edges": [{"source": "start", "target": "call"}],
        },
    }


def quantile(q: float) -> float:
    """A quantile of lantern_journal_write_seconds, interpolated within its buckets."""
    buckets: list[tuple[float, float]] = []
    for family in metrics.JOURNAL_WRITE.collect():
        for s in family.samples:
            if s.name.endswith("_bucket"):
                buckets.append((float(s.labels["le"]), s.value))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0
    if not total:
        return float("nan")
    want, low, seen = q * total, 0.0, 0.0
    for bound, count in buckets:
        if count >= want:
            if bound == float("inf"):
                return float("inf")  # past the top bound: the histogram cannot say by how much
            share = (want - seen) / (count - seen) if count > seen else 1.0
            return low + (bound - low) * share
        low, seen = bound, count
    return low


def quantile_ms(q: float) -> str:
    """``quantile(q)`` in ms, or "> top bound" when it lies past the histogram's last bucket."""
    value = quantile(q)
    if value == float("inf"):
        return f"> {metrics.JOURNAL_WRITE._upper_bounds[-2] * 1000:.0f}"
    return f"{value * 1000:.2f}"


def reset_histogram() -> None:
    metrics.JOURNAL_WRITE._metric_init()  # a fresh histogram per measurement


async def fresh_store(sqlite: bool, tmp: Path) -> tuple[Store, str | None]:
    if sqlite:
        store = open_store(f"sqlite:///{tmp / f'{secrets.token_hex(4)}.db'}")
        await store.open()
        return store, None
    base = os.environ.get("LANTERN_BENCH_PG_URL", DEFAULT_PG_URL)
    schema = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    store = open_store(f"{base}{'&' if '?' in base else '?'}options=-csearch_path%3D{schema}")
    await store.open()
    return store, schema


def drop(schema: str | None) -> None:
    if schema is not None:
        base = os.environ.get("LANTERN_BENCH_PG_URL", DEFAULT_PG_URL)
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


async def peer_stats(client: httpx.AsyncClient, peer: str) -> dict[str, int]:
    stats: dict[str, int] = (await client.get(f"{peer}/stats")).json()
    return stats


def start_peer(delay: float) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.slow_peer", str(delay)],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        text=True,
    )
    assert proc.stdout is not None
    return proc, f"http://127.0.0.1:{int(proc.stdout.readline())}"


async def one(kind: str, n: int, delay: float, sqlite: bool, tmp: Path) -> None:
    proc, peer = start_peer(delay)
    os.environ.update(
        {
            "OPENAI_BASE_URL": f"{peer}/v1",
            "OPENAI_API_KEY": "bench",
            "LANTERN_EGRESS_ALLOW": "127.0.0.1",
        }
    )
    store, schema = await fresh_store(sqlite, tmp)
    try:
        await apply_agent(store, agent(kind, peer, delay))
        async with (
            httpx.AsyncClient(timeout=30) as client,
            Worker(
                store,
                lantern.App(),
                worker_id="bench",
                lease_ttl=60,
                max_concurrent=n,
                poll_interval=0.05,
            ) as worker,
        ):
            serving = asyncio.create_task(worker.serve())
            gc.collect()
            before = rss_kib()
            reset_histogram()
            started = time.monotonic()
            ids: list[str] = []
            for first in range(0, n, 100):
                made = await asyncio.gather(
                    *(
                        create_run(store, f"slow-{kind}", {"n": k})
                        for k in range(first, min(n, first + 100))
                    )
                )
                ids += [r.id for r in made]
            waiting_rss = 0  # the most resident memory seen while runs wait on the peer
            statuses: list[str] = []
            while True:
                stats = await peer_stats(client, peer)
                if stats["inFlight"] > 0:
                    waiting_rss = max(waiting_rss, rss_kib())
                runs = [await store.get_run(i) for i in ids]
                statuses = [r.status for r in runs if r is not None]
                if all(s in ("succeeded", "failed", "cancelled") for s in statuses):
                    break
                await asyncio.sleep(0.1 if stats["inFlight"] < n else 0.5)
            wall = time.monotonic() - started
            most = (await peer_stats(client, peer))["most"]  # runs that waited at once
            await worker.stop(grace=5)
            await serving
        ok = statuses.count("succeeded")
        per_run = (waiting_rss - before) / max(1, most)  # over the runs that waited at once
        print(
            f"{kind:5} N={n:5}  succeeded {ok}/{n}  wall {wall:6.1f} s  "
            f"RSS {per_run:5.1f} KiB per waiting run  peer held {most} at once  "
            f"commit p50 {quantile_ms(0.5):>6} ms  p99 {quantile_ms(0.99):>7} ms",
            flush=True,
        )
    finally:
        await store.close()
        drop(schema)
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


async def pages(sqlite: bool, tmp: Path, events: int = 10_000, page: int = 100) -> None:
    store, schema = await fresh_store(sqlite, tmp)
    try:
        await store.put_agent("default", "a", {"name": "a", "graph": {"nodes": [], "edges": []}})
        run = await create_run(store, "a", {})
        lease = await store.acquire_lease(run.id, "bench", 600)
        assert lease is not None
        w = EventWriter(run.id)
        for first in range(0, events, 1000):
            batch = tuple(
                w.event("step_started", {"n": k}, step_id=f"s{k}")
                for k in range(first, first + 1000)
            )
            await store.append(Append(lease, batch))
        if schema is not None:
            async with store._connection() as conn:  # type: ignore[attr-defined]
                await conn.execute("ANALYZE journal_events")  # as autovacuum would
        for label, after in (("start", 0), ("end", events - page)):
            times = []
            for _ in range(200):
                t = time.perf_counter()
                got = await store.events(run.id, after=after, limit=page)
                times.append(time.perf_counter() - t)
                assert len(got) == page
            print(
                f"events page of {page} in a {events}-event run, at the {label:5}:"
                f" p50 {statistics.median(times) * 1e6:7.0f} µs",
                flush=True,
            )
        times = []
        for _ in range(20):
            t = time.perf_counter()
            await store.events(run.id, after=0)
            times.append(time.perf_counter() - t)
        print(
            f"the whole {events}-event journal (what every page read before):"
            f" p50 {statistics.median(times) * 1e6:7.0f} µs",
            flush=True,
        )
    finally:
        await store.close()
        drop(schema)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", default="500,2000,5000")
    parser.add_argument("--kind", default="http,model")
    parser.add_argument("--delay", type=float, default=2.0)
    parser.add_argument("--sqlite", action="store_true")
    parser.add_argument("--pages", action="store_true")
    args = parser.parse_args()
    # It queues thousands of runs of one workspace at once, past a tenant's default quota.
    os.environ.setdefault("LANTERN_MAX_QUEUED_RUNS", "100000")
    backend = "SQLite" if args.sqlite else "PostgreSQL"
    print(f"backend: {backend}; cpus: {os.cpu_count()}; load: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        if args.pages:
            await pages(args.sqlite, Path(tmp))
            return
        for kind in args.kind.split(","):
            for n in (int(x) for x in args.runs.split(",")):
                await one(kind, n, args.delay, args.sqlite, Path(tmp))


if __name__ == "__main__":
    asyncio.run(main())
