"""The claim's cost under flow control (docs/flow-control.md), on SQLite and PostgreSQL.

For each backlog of 0, 10,000 and 100,000 queued runs, a fresh database holds the backlog of a
workspace of its own (inserted in bulk, tests/queue_fill.py) and the claim is timed as a
replica calls it (``Store.claim_runs(worker, ttl, BATCH, ("queued",))``), round after round:

- ``flow``: the runs are under flow control, over 1,000 distinct concurrency keys with a limit
  of 1 (run i has key ``k{i % 1000}``); every claim also sees the slots of the keys the rounds
  before it left held;
- ``free``: the same backlog with no flow control, for scale.

Before each round ``BATCH`` runs are added at the back of the queue (so the backlog stays at its
size, and a "0" backlog is exactly the runs one claim takes) and the runs the round before
claimed are finished (straight in the database, untimed: the claim, not the drive, is measured).
The figure is µs per claimed run, the median over rounds, with the lowest and highest round,
and this process's CPU µs per claimed run (the whole claim for SQLite, which runs in process;
the client's share for PostgreSQL), which a loaded machine moves less than wall time. For a
PostgreSQL server on this machine, the server's share too: the CPU time of the benchmark's
own backends (found by their application_name) read from /proc/PID/schedstat.

    .venv/bin/python bench/flow.py [--rounds 15] [--batch 100] [--sizes 0,10000,100000]
        [--backends sqlite,postgres]

``LANTERN_BENCH_PG_URL`` overrides the PostgreSQL URL; PostgreSQL is skipped with a note when it
does not answer. SQLite lives in a temporary directory and PostgreSQL in fresh schemas dropped at
the end. That steps/s does not move when no agent uses flow control is `bench/steps.py --compare
REF` (this build against REF, interleaved in one run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python bench/flow.py` from anywhere

from lantern.store import open_store  # noqa: E402
from lantern.store.base import Store  # noqa: E402
from tests.queue_fill import fill  # noqa: E402

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
KEYS = 1000
DEFINITION = {
    "name": "bench",
    "concurrency": {"key": "{{ input.k }}", "limit": 1},
    "graph": {"nodes": [{"id": "start", "type": "trigger"}], "edges": []},
}


def finish(url: str, run_ids: list[str]) -> None:
    """What the drives of the claimed runs would leave: the runs finished, leases released."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        with conn:
            marks = ",".join("?" * len(run_ids))
            conn.execute(f"UPDATE runs SET status = 'succeeded' WHERE id IN ({marks})", run_ids)
            conn.execute(f"UPDATE run_locks SET expires_at = 0 WHERE run_id IN ({marks})", run_ids)
        conn.close()
        return
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute("UPDATE runs SET status = 'succeeded' WHERE id = ANY(%s)", (run_ids,))
        pg.execute("UPDATE run_locks SET expires_at = 'epoch' WHERE run_id = ANY(%s)", (run_ids,))


def backends_cpu(url: str, name: str) -> dict[int, int]:
    """CPU ns so far of each server backend whose application_name is ``name`` ({} when the
    server's processes are not readable here)."""
    if url.startswith("sqlite"):
        return {}
    with psycopg.connect(url, autocommit=True) as pg:
        pids = [
            r[0]
            for r in pg.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
            )
        ]
    found: dict[int, int] = {}
    for pid in pids:
        try:
            found[pid] = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return found


async def measure(
    url: str, size: int, flow: bool, rounds: int, batch: int
) -> tuple[list[float], list[float], list[float]]:
    name = f"bench-flow-{secrets.token_hex(4)}"
    os.environ["PGAPPNAME"] = name  # the store's connections, for their CPU time
    store: Store = open_store(url)
    await store.open()
    try:
        await store.put_agent("bulk", "bench", DEFINITION)
        keys = KEYS if flow else None
        if size:
            fill(url, "bulk", "bench", size, keys=keys, prefix="backlog")
        per_run: list[float] = []
        cpu_per_run: list[float] = []
        server_per_run: list[float] = []
        claimed: list[str] = []
        for r in range(rounds):
            if claimed:
                finish(url, claimed)
            # The round's own runs at the back of the queue, keys after the backlog's.
            fill(url, "bulk", "bench", batch, keys=keys, prefix=f"r{r:04d}")
            server = backends_cpu(url, name)
            started, cpu = time.perf_counter(), time.process_time()
            leases = await store.claim_runs("bench", 60, batch, ("queued",))
            took, cpu = time.perf_counter() - started, time.process_time() - cpu
            after = backends_cpu(url, name)
            claimed = [lease.run_id for lease in leases]
            if claimed:
                per_run.append(took / len(claimed) * 1e6)
                cpu_per_run.append(cpu / len(claimed) * 1e6)
                if server:
                    spent = sum(after[p] - server[p] for p in after if p in server)
                    server_per_run.append(spent / 1e3 / len(claimed))
        return per_run, cpu_per_run, server_per_run
    finally:
        await store.close()


def pg_schema_url(base: str, schema: str) -> str:
    return base + ("&" if "?" in base else "?") + f"options=-csearch_path%3D{schema}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--sizes", default="0,10000,100000")
    ap.add_argument("--backends", default="sqlite,postgres")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    pg_base = os.environ.get("LANTERN_BENCH_PG_URL", DEFAULT_PG_URL)
    print(f"claim of {args.batch} runs, {args.rounds} rounds; {KEYS} keys, limit 1 (flow)")
    print(
        f"{'backend':10} {'queued':>8} {'kind':5} {'µs/run p50':>11} {'min':>8} {'max':>8}"
        f" {'CPU µs/run':>11} {'server CPU':>11}"
    )
    for backend in args.backends.split(","):
        schemas: list[str] = []
        try:
            if backend == "postgres":
                try:
                    psycopg.connect(pg_base, connect_timeout=3).close()
                except psycopg.OperationalError as exc:
                    print(f"postgres: skipped ({exc})")
                    continue
            for size in sizes:
                for flow in (True, False):
                    with tempfile.TemporaryDirectory() as tmp:
                        if backend == "sqlite":
                            url = f"sqlite:///{Path(tmp) / 'bench.db'}"
                        else:
                            schema = f"bench_flow_{secrets.token_hex(4)}"
                            schemas.append(schema)
                            with psycopg.connect(pg_base, autocommit=True) as pg:
                                pg.execute(f"CREATE SCHEMA {schema}")
                            url = pg_schema_url(pg_base, schema)
                        per_run, cpu, server = asyncio.run(
                            measure(url, size, flow, args.rounds, args.batch)
                        )
                    kind = "flow" if flow else "free"
                    print(
                        f"{backend:10} {size:>8,} {kind:5} {statistics.median(per_run):>11.1f}"
                        f" {min(per_run):>8.1f} {max(per_run):>8.1f}"
                        f" {statistics.median(cpu):>11.1f}"
                        f" {statistics.median(server) if server else float('nan'):>11.1f}",
                        flush=True,
                    )
        finally:
            if schemas:
                with psycopg.connect(pg_base, autocommit=True) as pg:
                    for schema in schemas:
                        pg.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()
