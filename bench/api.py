"""HTTP throughput and latency of a real `lantern serve`, on SQLite and PostgreSQL.

For each backend this starts ``lantern serve --app tests.crash.crash_app:app`` as a subprocess
on a fresh database (a temporary SQLite file; a fresh PostgreSQL schema, dropped at the end),
issues an API key in-process, applies a 3-step no-op agent (trigger -> t1 -> t2 -> t3, each a
tool node calling ``noop``) over HTTP, and measures:

(a) creates: ``--clients`` concurrent clients (one asyncio client process, keep-alive
    connections, a minimal HTTP/1.1 client so the client's own cost stays small) POST
    ``--creates`` runs in a closed loop -> creates/s and p50/p99/max latency of POST /v1/runs.
    The server's in-process executor runs the created runs meanwhile, as it does in service.
(b) end-to-end: the same clients submit ``--runs`` runs and the clock stops when the database
    says all of them succeeded -> runs/s (and steps/s) with creation, execution and journal.
(c) overhead: ``--samples`` sequential iterations, each one POST /v1/runs over HTTP (one client)
    and then, in this process against the same database, the store's work for a create:
    ``store.get_api_key`` (the auth lookup) plus ``lantern.engine.runs.create_run``. The server's
    own overhead per run is the HTTP p50 minus the store p50. The two alternate, so drift hits
    both alike, and each is timed on a quiet server: the executor has finished every run
    before the next sample (it is the same work either way, and the store measured from this
    process must not queue behind the server's journal writes).

Every create carries a unique Idempotency-Key, as an agent's retried create would.
Targets: POST /v1/runs p99 under 20 ms at 16 concurrent clients on PostgreSQL, and the
server's own overhead per run no more than the store's work for it (ratio <= 1).

    .venv/bin/python bench/api.py [--creates 2000] [--clients 16] [--runs 500] [--samples 300]
                                  [--backends sqlite,postgres]

``LANTERN_BENCH_PG_URL`` overrides the PostgreSQL URL; PostgreSQL is skipped with a note when it
does not answer. The client load runs in a separate process from the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.conninfo import conninfo_to_dict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python bench/api.py` from anywhere

import lantern  # noqa: E402
from lantern.engine.runs import create_run  # noqa: E402
from lantern.server.auth import issue_key  # noqa: E402
from lantern.store import open_store  # noqa: E402
from lantern.store.base import Store  # noqa: E402

LANTERN = str(Path(sys.executable).parent / "lantern")
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
WORKSPACE = "bench"
AGENT = "bench-noop-3"
STEPS = 3
P99_TARGET_MS = 20.0  # POST /v1/runs at 16 clients on PostgreSQL
OVERHEAD_TARGET = 1.0  # the server's own overhead / the store's work, per create
WARMUP = 200  # untimed creates before (a): connections, caches, prepared statements


def agent_definition() -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"}]
    edges = []
    previous = "start"
    for k in range(1, STEPS + 1):
        nodes.append({"id": f"t{k}", "type": "tool", "data": {"tool": "noop", "args": {}}})
        edges.append({"source": previous, "target": f"t{k}"})
        previous = f"t{k}"
    return {"name": AGENT, "graph": {"nodes": nodes, "edges": edges}}


# -- a minimal keep-alive HTTP/1.1 client ---------------------------------------------------


class Connection:
    """One keep-alive connection; a request is bytes out, status and body back."""

    def __init__(self, port: int, key: str) -> None:
        self.port = port
        self.head = (
            f"Host: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: application/json\r\n"
        ).encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.transport.get_extra_info("socket").setsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
        )

    async def create(self, n: int, idempotency_key: str) -> tuple[int, bytes]:
        body = json.dumps({"agentName": AGENT, "input": {"n": n}}).encode()
        request = (
            b"POST /v1/runs HTTP/1.1\r\n"
            + self.head
            + f"Idempotency-Key: {idempotency_key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert self.reader is not None and self.writer is not None
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = next(
            int(v)
            for k, _, v in (h.partition(":") for h in lines[1:])
            if k.lower() == "content-length"
        )
        return status, await self.reader.readexactly(length)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()


async def closed_loop(
    connections: Sequence[Connection], count: int, prefix: str
) -> tuple[list[float], float, dict[int, int]]:
    """Each connection sends its next create as soon as its last one answered."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    next_n = 0

    async def client(conn: Connection) -> None:
        nonlocal next_n
        while next_n < count:
            n, next_n = next_n, next_n + 1
            started = time.perf_counter()
            status, _ = await conn.create(n, f"{prefix}-{n}")
            latencies.append((time.perf_counter() - started) * 1000)
            statuses[status] = statuses.get(status, 0) + 1

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in connections))
    return latencies, time.perf_counter() - started, statuses


# -- the client process ---------------------------------------------------------------------


async def client_main(spec: dict[str, Any]) -> None:
    """Warm up, say ``ready``, wait for a line on stdin, run the load, print the result."""
    connections = [Connection(spec["port"], spec["key"]) for _ in range(spec["clients"])]
    await asyncio.gather(*(c.open() for c in connections))
    if spec["warmup"]:
        await closed_loop(connections, spec["warmup"], f"{spec['prefix']}-warm")
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    cpu = time.process_time()
    latencies, elapsed, statuses = await closed_loop(connections, spec["count"], spec["prefix"])
    cpu = time.process_time() - cpu
    for c in connections:
        await c.close()
    result = {"latencies": latencies, "elapsed": elapsed, "statuses": statuses, "cpu": cpu}
    print(json.dumps(result), flush=True)


@dataclass
class ClientProcess:
    """The client load in a process of its own (the server is another)."""

    spec: dict[str, Any]
    proc: subprocess.Popen[str] = field(init=False)

    def start(self) -> ClientProcess:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--client", json.dumps(self.spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        return self

    async def ready(self) -> None:
        assert self.proc.stdout is not None
        line = await asyncio.to_thread(self.proc.stdout.readline)
        if line.strip() != "ready":
            raise RuntimeError(f"the client process said {line!r}")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    async def result(self) -> dict[str, Any]:
        out, _ = await asyncio.to_thread(self.proc.communicate, timeout=600)
        if self.proc.returncode != 0:
            raise RuntimeError(f"the client process failed ({self.proc.returncode})")
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        bad = {s: n for s, n in result["statuses"].items() if s != "202"}
        if bad:
            raise RuntimeError(f"POST /v1/runs answered {bad}")
        return result


# -- the server and the database --------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    def __init__(self, database_url: str, log: Path) -> None:
        self.database_url = database_url
        self.port = free_port()
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {
            **os.environ,
            "LANTERN_DATABASE_URL": self.database_url,
            "LANTERN_PORT": str(self.port),
            "LANTERN_WORKER_ID": f"bench-{self.port}",
            "PYTHONPATH": str(ROOT),
            "LANTERN_RATE_LIMIT": "0",  # a throughput bench: one key sends as fast as it can
        }
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [LANTERN, "serve", "--app", "tests.crash.crash_app:app"],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lantern serve exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("lantern serve did not answer /healthz")

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return process_cpu(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)


def process_cpu(pid: int | str) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_cpu() -> float:
    """CPU seconds of every local ``postgres`` process so far (0 if none can be read)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            if text.split("(", 1)[1].split(")", 1)[0] == "postgres":
                total += process_cpu(stat.parent.name)
        except (OSError, IndexError):
            continue  # gone meanwhile
    return total


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


class Counter:
    """Counts runs by status straight from the database (cheaper than polling the API)."""

    def __init__(self, count: Callable[[], Awaitable[tuple[int, int]]]) -> None:
        self.count = count

    async def wait_finished(
        self, total: int, limit: float = 300, poll: float = 0.005
    ) -> tuple[float, int]:
        """Poll until ``total`` runs finished; the time it took and how many succeeded."""
        started = time.perf_counter()
        deadline = started + limit
        while True:
            finished, succeeded = await self.count()
            if finished >= total:
                return time.perf_counter() - started, succeeded
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{finished} of {total} runs finished in {limit:.0f} s")
            await asyncio.sleep(poll)


SQL_COUNT = (
    "SELECT count(*) FILTER (WHERE status IN ('succeeded', 'failed', 'cancelled')),"
    " count(*) FILTER (WHERE status = 'succeeded') FROM runs"
)


def sqlite_counter(path: Path) -> Counter:
    conn = sqlite3.connect(path, check_same_thread=False)

    async def count() -> tuple[int, int]:
        row = conn.execute(SQL_COUNT).fetchone()
        return int(row[0]), int(row[1])

    return Counter(count)


async def pg_counter(url: str) -> tuple[Counter, psycopg.AsyncConnection[Any]]:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)

    async def count() -> tuple[int, int]:
        cur = await conn.execute(SQL_COUNT)
        row = await cur.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    return Counter(count), conn


# -- one backend --------------------------------------------------------------------------------


@dataclass
class Figures:
    backend: str
    creates: int = 0
    creates_per_s: float = 0.0
    p50: float = 0.0
    p99: float = 0.0
    max: float = 0.0
    server_cpu: float = 0.0  # share of one core during (a)
    client_cpu: float = 0.0
    db_cpu: float = 0.0  # PostgreSQL's processes (SQLite works inside the server)
    machine: float = 0.0  # all CPUs busy, whoever used them
    drained_in: float = 0.0
    runs: int = 0
    runs_per_s: float = 0.0
    samples: int = 0
    http_p50: float = 0.0
    store_p50: float = 0.0
    auth_p50: float = 0.0
    create_p50: float = 0.0


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def bench_backend(
    backend: str, url: str, counter: Counter, log: Path, args: argparse.Namespace
) -> Figures:
    figures = Figures(backend)
    store = open_store(url)
    await store.open()
    server = ServerProcess(url, log)
    clients: list[ClientProcess] = []
    try:
        key, plaintext = await issue_key(
            store, WORKSPACE, {"runs:execute", "runs:read", "agents:write"}
        )
        await asyncio.to_thread(server.start)
        async with httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {plaintext}"}
        ) as http:
            response = await http.put(f"/v1/agents/{AGENT}", json=agent_definition())
            response.raise_for_status()
        spec = {"port": server.port, "key": plaintext, "clients": args.clients}
        total = 0

        # (a) creates at --clients concurrent clients
        client = ClientProcess({**spec, "count": args.creates, "warmup": WARMUP, "prefix": "a"})
        clients.append(client)
        await client.start().ready()
        total += WARMUP
        await counter.wait_finished(total)  # the warm-up's runs are done before the clock
        cpu, db, busy = server.cpu_seconds(), postgres_cpu(), machine_busy()
        client.go()
        a = await client.result()
        figures.server_cpu = (server.cpu_seconds() - cpu) / a["elapsed"]
        figures.db_cpu = (postgres_cpu() - db) / a["elapsed"] if backend == "postgres" else 0.0
        after = machine_busy()
        figures.machine = (after[0] - busy[0]) / (after[1] - busy[1])
        total += args.creates
        figures.drained_in, _ = await counter.wait_finished(total)
        figures.creates = args.creates
        figures.creates_per_s = args.creates / a["elapsed"]
        figures.p50 = percentile(a["latencies"], 0.50)
        figures.p99 = percentile(a["latencies"], 0.99)
        figures.max = max(a["latencies"])
        figures.client_cpu = a["cpu"] / a["elapsed"]

        # (b) end to end: submit --runs runs, stop when all succeeded
        client = ClientProcess({**spec, "count": args.runs, "warmup": 0, "prefix": "b"})
        clients.append(client)
        await client.start().ready()
        client.go()
        elapsed, succeeded = await counter.wait_finished(total + args.runs)
        await client.result()
        total += args.runs
        figures.runs = args.runs
        figures.runs_per_s = args.runs / elapsed
        if succeeded != total:
            raise RuntimeError(f"{total - succeeded} runs did not succeed")

        # (c) HTTP vs the store's own work, interleaved, one at a time
        figures.samples = args.samples
        http_ms, auth_ms, create_ms = await overhead(
            store, server.port, key.id, plaintext, counter, total, args
        )
        figures.http_p50 = statistics.median(http_ms)
        figures.auth_p50 = statistics.median(auth_ms)
        figures.create_p50 = statistics.median(create_ms)
        figures.store_p50 = statistics.median(map(sum, zip(auth_ms, create_ms, strict=True)))
        await counter.wait_finished(total + 2 * (args.samples + 20))
    finally:
        for c in clients:
            if c.proc.poll() is None:
                c.proc.kill()
                c.proc.wait()
        server.stop()
        await store.close()
    return figures


async def overhead(
    store: Store,
    port: int,
    key_id: str,
    plaintext: str,
    counter: Counter,
    total: int,
    args: argparse.Namespace,
) -> tuple[list[float], list[float], list[float]]:
    """One HTTP create, then the store's work for one, each on a quiet server.

    After the HTTP create the executor (woken by it) runs that run and the previous store-made
    one to the end before the store is timed; the store-made run waits, queued, for the next
    HTTP create to wake the executor. So neither is timed while the executor works (but for a
    rare 0.2 s poll of the executor's), and the store never waits on the server's writes.
    """
    conn = Connection(port, plaintext)
    await conn.open()
    http_ms: list[float] = []
    auth_ms: list[float] = []
    create_ms: list[float] = []
    try:
        for i in range(-20, args.samples):  # 20 untimed warm-up iterations
            started = time.perf_counter()
            status, _ = await conn.create(i, f"c-http-{i}")
            http = (time.perf_counter() - started) * 1000
            if status != 202:
                raise RuntimeError(f"POST /v1/runs answered {status}")
            total += 1
            await counter.wait_finished(total, poll=0.001)
            started = time.perf_counter()
            found = await store.get_api_key(key_id)
            auth = (time.perf_counter() - started) * 1000
            assert found is not None
            started = time.perf_counter()
            await create_run(store, AGENT, {"n": i}, WORKSPACE, idempotency_key=f"c-store-{i}")
            create = (time.perf_counter() - started) * 1000
            total += 1
            if i >= 0:
                http_ms.append(http)
                auth_ms.append(auth)
                create_ms.append(create)
    finally:
        await conn.close()
    return http_ms, auth_ms, create_ms


async def run_sqlite(args: argparse.Namespace) -> Figures | None:
    with tempfile.TemporaryDirectory(prefix="lantern-bench-api-") as tmp:
        path = Path(tmp) / "bench.db"
        print(f"sqlite:   {sqlite3.sqlite_version}, {path}")
        return await bench_backend(
            "sqlite", f"sqlite:///{path}", sqlite_counter(path), Path(tmp) / "serve.log", args
        )


def describe_pg(url: str) -> str:
    info = conninfo_to_dict(url)
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


async def run_postgres(args: argparse.Namespace) -> Figures | None:
    url = os.environ.get("LANTERN_BENCH_PG_URL", DEFAULT_PG_URL)
    try:
        admin = await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        print(f"postgres: skipped, {describe_pg(url)} did not answer: {' '.join(str(exc).split())}")
        return None
    schema = f"bench_api_{secrets.token_hex(4)}"
    counter_conn: psycopg.AsyncConnection[Any] | None = None
    try:
        cur = await admin.execute(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit'),"
            " current_setting('fsync')"
        )
        row = await cur.fetchone()
        assert row is not None
        print(
            f"postgres: {row[0]} at {describe_pg(url)}, schema {schema}"
            f" (synchronous_commit={row[1]}, fsync={row[2]})"
        )
        await admin.execute(f"CREATE SCHEMA {schema}")
        scoped = url + ("&" if "?" in url else "?") + f"options=-csearch_path%3D{schema}"
        counter, counter_conn = await pg_counter(scoped)
        with tempfile.TemporaryDirectory(prefix="lantern-bench-api-") as tmp:
            return await bench_backend("postgres", scoped, counter, Path(tmp) / "serve.log", args)
    finally:
        if counter_conn is not None:
            await counter_conn.close()
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()


# -- output -------------------------------------------------------------------------------------


def table(rows: Sequence[Sequence[str]], right: set[int]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, r in enumerate(rows):
        print(
            "  ".join(
                v.rjust(w) if i in right else v.ljust(w)
                for i, (v, w) in enumerate(zip(r, widths, strict=True))
            ).rstrip()
        )
        if n == 0:
            print("  ".join("-" * w for w in widths))


def report(results: Sequence[Figures], args: argparse.Namespace) -> None:
    print()
    print(f"(a) POST /v1/runs, {args.clients} concurrent clients, closed loop")
    head = "backend creates creates/s p50_ms p99_ms max_ms server client db machine target"
    rows = [[h.replace("_", " ") for h in head.split()]]
    for f in results:
        target = "-"
        if f.backend == "postgres":
            met = f.p99 < P99_TARGET_MS
            target = f"p99 < {P99_TARGET_MS:g} ms: " + ("met" if met else "MISSED")
        rows.append(
            [
                f.backend,
                f"{f.creates:,}",
                f"{f.creates_per_s:,.0f}",
                f"{f.p50:.2f}",
                f"{f.p99:.2f}",
                f"{f.max:.2f}",
                f"{f.server_cpu:.0%}",
                f"{f.client_cpu:.0%}",
                f"{f.db_cpu:.0%}" if f.backend == "postgres" else "-",
                f"{f.machine:.0%}",
                target,
            ]
        )
    table(rows, {1, 2, 3, 4, 5, 6, 7, 8, 9})
    print("server, client, db: CPU time of the server process, the client process and the")
    print("PostgreSQL processes / wall time of the creates (one core = 100%); machine: share of")
    print(f"all {os.cpu_count()} CPUs busy meanwhile, whoever used them (other work included).")
    caught_up = ", ".join(f"{f.drained_in:.1f} s on {f.backend}" for f in results)
    print(f"The executor ran the created runs meanwhile; it finished them {caught_up} later.")

    print()
    print(
        f"(b) end to end: {args.runs} runs of a {STEPS}-step no-op agent submitted by"
        f" {args.clients} clients, until all succeeded"
    )
    rows = [["backend", "runs", "runs/s", "steps/s"]]
    for f in results:
        rows.append(
            [f.backend, f"{f.runs:,}", f"{f.runs_per_s:,.0f}", f"{STEPS * f.runs_per_s:,.0f}"]
        )
    table(rows, {1, 2, 3})

    print()
    print(
        f"(c) the server's own overhead per create, {args.samples} interleaved sequential"
        " samples (p50 ms)"
    )
    head = f"backend HTTP store get_api_key create_run overhead ratio HTTP@{args.clients} target"
    rows = [head.split()]
    for f in results:
        over = f.http_p50 - f.store_p50
        ratio = over / f.store_p50
        met = ratio <= OVERHEAD_TARGET
        rows.append(
            [
                f.backend,
                f"{f.http_p50:.2f}",
                f"{f.store_p50:.2f}",
                f"{f.auth_p50:.2f}",
                f"{f.create_p50:.2f}",
                f"{over:.2f}",
                f"{ratio:.2f}x",
                f"{f.p50:.2f}",
                f"overhead <= store: {'met' if met else 'MISSED'}",
            ]
        )
    table(rows, {1, 2, 3, 4, 5, 6, 7})
    print("HTTP: POST /v1/runs from one client; store: get_api_key + create_run in this process")
    print("(a separate process, the same database); overhead = HTTP - store, the server's own")
    print("work (HTTP, routing, validation, JSON, the event loop); ratio = overhead / store.")
    print(f"HTTP@{args.clients}: the p50 of (a), with queueing at {args.clients} clients.")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--creates", type=int, default=2000, help="timed creates in (a), default 2000")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients, default 16")
    p.add_argument("--runs", type=int, default=500, help="end-to-end runs in (b), default 500")
    p.add_argument("--samples", type=int, default=300, help="samples in (c), default 300")
    p.add_argument("--backends", default="sqlite,postgres", help="sqlite, postgres or both")
    p.add_argument("--client", help=argparse.SUPPRESS)  # the client process's JSON spec
    args = p.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not args.backends or set(args.backends) - {"sqlite", "postgres"}:
        p.error("--backends takes sqlite, postgres or both")
    for name in ("creates", "clients", "runs", "samples"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    return args


async def main_async(args: argparse.Namespace) -> int:
    print(
        f"lantern {lantern.__version__}, Python {platform.python_version()},"
        f" {os.cpu_count()} CPUs shared by the server, the client process and the database"
        f" (load average {os.getloadavg()[0]:.1f} at the start: other work on the machine"
        " counts too); one `lantern serve` process per backend, the client load in another"
        " process"
    )
    results = []
    for backend in args.backends:
        run = run_sqlite if backend == "sqlite" else run_postgres
        figures = await run(args)
        if figures is not None:
            results.append(figures)
    if results:
        report(results, args)
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.client:
        asyncio.run(client_main(json.loads(args.client)))
        return 0
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
