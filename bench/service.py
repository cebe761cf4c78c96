"""Steps/s of `lantern serve` driven over HTTP, beside the same work in-process, in one run.

For each backend this starts ``lantern serve --app service:app --app-dir bench`` as a user
starts it: default settings (the default per-key request limit among them), text logs, metrics
on, and tracing on with its default sampler, exporting OTLP/HTTP to a collector on 127.0.0.1
(a small process of this script that answers every export and keeps nothing). The app is this
module's ``app``: a ``noop`` tool and code-first agents making 10 (or 1) no-op ``ctx.step``
calls; a graph agent of 10 no-op tool nodes is applied over HTTP. A client process of its own
(keep-alive HTTP/1.1 connections, one per lane) then, for each run, sends
``POST /v1/runs?wait=30`` and checks the run succeeded; a 429 is waited out as its
Retry-After says and counted. That one request is the path a client should take for a short
run (the server answers with the finished run, or with the run as it stands when the wait ran
out, and the client then follows with ``GET /v1/runs/{id}?wait=30``), so the steps/s sections
and the HTTP / in-process ratio measure it. The same sections are measured a second time on the
same server with two requests a run, ``POST /v1/runs`` then ``GET /v1/runs/{id}?wait=30`` (the
column "HTTP POST+GET"), for comparison: what a client that does not ask to wait on the create
pays, a second request's parsing, authentication and reads.

Measured, round by round and interleaved (which path goes first alternates by round), the same
work over HTTP and in this process (``create_run`` under an idempotency key, as the client
sends one, then ``Runner.drive``; the same app, a database of its own so neither takes the
other's runs, no tracing and no receipts, as a library user has it):

- sequential: code-first runs of 10 steps and of 1 step, one at a time -> steps/s, and the
  marginal cost of one step, (µs per 10-step run - µs per 1-step run) / 9: what a step adds
  to a run, with the run's fixed costs (create, wait, lease, opening and closing commits)
  taken out. Graph runs of 10 steps, one at a time, too.
- 32 and 256 runs at a time (code-first, 10 steps) -> steps/s.
- CPU per step: the server process's user+system time (/proc/PID/stat), its child
  processes' included, over the HTTP sections (each path's own), this process's over the
  in-process ones (PostgreSQL's own processes are not in either).
- latency of a 1-step run, POST to finished, one at a time: with ``POST /v1/runs?wait=30``
  (one request, answered with the finished run when the server supports it; otherwise the
  client follows with ``GET ?wait``) and with POST then GET ``?wait`` -> p50 and p99.

Each figure's ratio is HTTP / in-process in the same rounds (the median of the rounds' ratios,
so a burst of load on the shared machine lands in one round's pair), for the one-request path
and for POST+GET. With ``--baseline`` the other revision's server is measured on the
one-request path too, interleaved, and HTTP / baseline printed beside.
Targets: HTTP within 1.3x of in-process, sequential and 32 at a time, both backends; a 1-step
run POST -> finished p50 under 5 ms and p99 under 20 ms on SQLite.

    .venv/bin/python bench/service.py [--rounds 3] [--runs 40] [--backends sqlite,postgres]
        [--sections '32 code,latency'] [--baseline DIR]

``LANTERN_BENCH_PG_URL`` overrides the PostgreSQL URL (default 127.0.0.1:5432/test); the bench
creates two fresh schemas there and drops them at the end. SQLite lives in a temporary
directory.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.server
import json
import os
import platform
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.conninfo import conninfo_to_dict

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # `python bench/service.py` from anywhere

import lantern  # noqa: E402

LANTERN = str(Path(sys.executable).parent / "lantern")
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
WORKSPACE = "bench"
STEPS = 10
CODE = "bench-code-10"
CODE_ONE = "bench-code-1"
GRAPH = "bench-graph-10"
RATIO_TARGET = 1.3  # HTTP / in-process, sequential and 32 at a time
P50_TARGET_MS = 5.0  # 1-step run, POST -> finished, SQLite
P99_TARGET_MS = 20.0
WAIT_S = 30
GIVE_UP_S = 600  # a run not finished by then fails the bench

# -- the app `lantern serve` loads (and this process uses in-process) -----------------------

app = lantern.App()


@app.tool("noop")
async def noop() -> None:
    return None


@app.agent(CODE)
async def code_ten(ctx: lantern.Context, n: int) -> None:
    for k in range(1, STEPS + 1):
        await ctx.step(f"s{k}", noop)


@app.agent(CODE_ONE)
async def code_one(ctx: lantern.Context, n: int) -> None:
    await ctx.step("s1", noop)


def graph_definition() -> dict[str, Any]:
    """trigger -> t1 -> ... -> t10, each a tool node calling ``noop``."""
    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"}]
    edges: list[dict[str, str]] = []
    previous = "start"
    for k in range(1, STEPS + 1):
        nodes.append({"id": f"t{k}", "type": "tool", "data": {"tool": "noop", "args": {}}})
        edges.append({"source": previous, "target": f"t{k}"})
        previous = f"t{k}"
    return {"name": GRAPH, "graph": {"nodes": nodes, "edges": edges}}


STEPS_OF = {CODE: STEPS, CODE_ONE: 1, GRAPH: STEPS}

# -- a minimal keep-alive HTTP/1.1 client (its own cost stays small) ------------------------


class Connection:
    def __init__(self, port: int, key: str) -> None:
        self.port = port
        self.head = (
            f"Host: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: application/json\r\n"
        ).encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.throttled = 0

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.transport.get_extra_info("socket").setsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
        )

    async def _once(self, request: bytes) -> tuple[int, dict[str, str], bytes]:
        if self.writer is None or self.writer.is_closing():
            await self.open()
        assert self.reader is not None and self.writer is not None
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])
        }
        body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            self.writer.close()
        return status, headers, body

    async def request(self, method: str, path: str, body: bytes = b"", extra: str = "") -> Any:
        """The answer's JSON; a closed keep-alive connection is reopened and the request sent
        again (every create carries an Idempotency-Key), a 429 waited out and retried."""
        request = (
            f"{method} {path} HTTP/1.1\r\n".encode()
            + self.head
            + f"{extra}Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        while True:
            try:
                status, headers, answer = await self._once(request)
            except (asyncio.IncompleteReadError, ConnectionError):
                self.writer = None
                continue
            if status == 429:
                self.throttled += 1
                await asyncio.sleep(float(headers.get("retry-after", "1")))
                continue
            if status >= 300:
                raise RuntimeError(f"{method} {path} answered {status}: {answer[:300]!r}")
            return json.loads(answer)

    async def run(self, agent: str, n: int, key: str, one_request: bool) -> None:
        """Create a run and wait until it finished; it must have succeeded."""
        body = json.dumps({"agentName": agent, "input": {"n": n}}).encode()
        path = f"/v1/runs?wait={WAIT_S}" if one_request else "/v1/runs"
        run = await self.request("POST", path, body, f"Idempotency-Key: {key}\r\n")
        deadline = time.monotonic() + GIVE_UP_S
        # A wait that ends with the run unfinished (a loaded machine, 256 in flight) is
        # followed by another, as a client does, until the bench gives up on the run.
        while run["status"] not in ("succeeded", "failed", "cancelled"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {run['id']} still {run['status']} after {GIVE_UP_S} s")
            run = await self.request("GET", f"/v1/runs/{run['id']}?wait={WAIT_S}")
        if run["status"] != "succeeded":
            raise RuntimeError(f"run {run['id']} ended {run['status']}: {run.get('error')}")

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with _quiet():
                await self.writer.wait_closed()


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], OSError)  # type: ignore[arg-type]


async def lanes(
    connections: Sequence[Connection], agent: str, count: int, prefix: str, one_request: bool
) -> tuple[list[float], float]:
    """``len(connections)`` runs in flight until ``count`` finished; per-run ms and seconds."""
    latencies: list[float] = []
    todo = list(range(count))

    async def lane(conn: Connection) -> None:
        while todo:
            n = todo.pop()
            started = time.perf_counter()
            await conn.run(agent, n, f"{prefix}-{n}", one_request)
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(lane(c) for c in connections))
    return latencies, time.perf_counter() - started


async def client_main(port: int, key: str) -> None:
    """Answers one JSON line per JSON command line on stdin: a batch of runs over HTTP."""
    pool: list[Connection] = []
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        spec = json.loads(line)
        while len(pool) < spec["lanes"]:
            pool.append(Connection(port, key))
        used = pool[: spec["lanes"]]
        throttled = sum(c.throttled for c in used)
        latencies, elapsed = await lanes(
            used, spec["agent"], spec["count"], spec["prefix"], spec["oneRequest"]
        )
        throttled = sum(c.throttled for c in used) - throttled
        out = {"latencies": latencies, "elapsed": elapsed, "throttled": throttled}
        print(json.dumps(out), flush=True)
    for c in pool:
        await c.close()


class ClientProcess:
    def __init__(self, port: int, key: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--client", f"{port}:{key}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    async def batch(
        self, agent: str, count: int, lanes: int, prefix: str, one_request: bool = False
    ) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        spec = {"agent": agent, "count": count, "lanes": lanes, "prefix": prefix}
        self.proc.stdin.write(json.dumps({**spec, "oneRequest": one_request}) + "\n")
        self.proc.stdin.flush()
        line = await asyncio.to_thread(self.proc.stdout.readline)
        if not line:
            raise RuntimeError(f"the client process failed ({self.proc.wait()})")
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the collector the server exports its spans to -------------------------------------------


class _Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


def collector_main(port: int) -> None:
    http.server.ThreadingHTTPServer(("127.0.0.1", port), _Sink).serve_forever()


# -- the server --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_cpu(pid: int | str) -> float:
    """User + system CPU seconds of a process so far, its children's included, those still
    running (the span export process) and those it has waited for (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    for child in Path(f"/proc/{pid}/task").glob("*/children"):
        for kid in child.read_text().split():
            try:
                ticks += round(process_cpu(kid) * os.sysconf("SC_CLK_TCK"))
            except (OSError, IndexError):
                pass  # exited meanwhile: counted in cutime from now on
    return ticks / os.sysconf("SC_CLK_TCK")


class ServerProcess:
    def __init__(
        self,
        database_url: str,
        log: Path,
        collector: int,
        source: str | None = None,
        workers: int = 1,
    ) -> None:
        self.source = source  # a checkout of another revision to serve from (PYTHONPATH)
        self.workers = workers  # `lantern serve --workers`
        self.database_url = database_url
        self.port = free_port()
        self.log = log
        self.collector = collector
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {
            **os.environ,
            "LANTERN_DATABASE_URL": self.database_url,
            "LANTERN_PORT": str(self.port),
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.collector}",
            # Its sessions are told apart in pg_stat_activity (a profile of what they wait on).
            "PGAPPNAME": "lantern-bench-serve" + ("-baseline" if self.source else ""),
        }
        if self.source:
            env["PYTHONPATH"] = self.source
        for name in list(env):  # as a user starts it: no setting of ours left in
            if name.startswith("LANTERN_") and name not in ("LANTERN_DATABASE_URL", "LANTERN_PORT"):
                del env[name]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [LANTERN, "serve", "--app", "service:app", "--app-dir", str(HERE)]
                + (["--workers", str(self.workers)] if self.workers > 1 else []),
                env=env,
                cwd=self.log.parent,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
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


# -- in-process --------------------------------------------------------------------------------


class InProcess:
    """The same runs, created and driven in this process on a database of its own."""

    def __init__(self, url: str) -> None:
        from lantern.store import open_store

        self.store = open_store(url)
        self.worker: Any = None
        self.made = 0

    async def open(self) -> None:
        from lantern.engine.runs import apply_agent
        from lantern.engine.worker import Worker

        await self.store.open()
        await apply_agent(self.store, graph_definition(), WORKSPACE)
        self.worker = Worker(self.store, app, worker_id="bench-in-process", lease_ttl=600)
        await self.worker.__aenter__()

    async def close(self) -> None:
        if self.worker is not None:
            await self.worker.__aexit__(None, None, None)
        await self.store.close()

    async def batch(self, agent: str, count: int, lanes: int) -> dict[str, Any]:
        from lantern.engine.runs import create_run

        runner = self.worker.runner
        latencies: list[float] = []
        todo = list(range(count))

        async def lane() -> None:
            while todo:
                n = todo.pop()
                started = time.perf_counter()
                # Under an idempotency key, as the HTTP client creates every run: the same work.
                self.made += 1
                key = f"in-process-{self.made}"
                run = await create_run(
                    self.store, agent, {"n": n}, WORKSPACE, idempotency_key=key, app=app
                )
                done = await runner.drive(run.id)
                if done is None or done.status != "succeeded":
                    raise RuntimeError(f"run {run.id} did not succeed")
                latencies.append((time.perf_counter() - started) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(lanes)))
        return {"latencies": latencies, "elapsed": time.perf_counter() - started, "throttled": 0}


# -- one backend -------------------------------------------------------------------------------


@dataclass
class Tally:
    """Steps, seconds and CPU seconds, per round."""

    rounds: list[tuple[int, float, float]] = field(default_factory=list)
    throttled: int = 0

    def add(self, steps: int, result: dict[str, Any], cpu: float) -> None:
        self.rounds.append((steps, result["elapsed"], cpu))
        self.throttled += result["throttled"]

    @property
    def steps(self) -> int:
        return sum(r[0] for r in self.rounds)

    @property
    def rate(self) -> float:
        return self.steps / sum(r[1] for r in self.rounds)

    @property
    def cpu_us(self) -> float:
        return sum(r[2] for r in self.rounds) / self.steps * 1e6

    def per_round(self) -> list[float]:
        return [seconds / steps for steps, seconds, _ in self.rounds]


def ratio(a: Tally, b: Tally) -> tuple[float, float, float]:
    """Median over rounds of a's time / b's time for the same steps (>1: a is slower), with
    the lowest and highest round's."""
    paired = [x / y for x, y in zip(a.per_round(), b.per_round(), strict=True)]
    return statistics.median(paired), min(paired), max(paired)


SECTIONS = ("seq code", "seq code 1-step", "seq graph", "32 code", "256 code")
# HTTP: a run is one request, POST ?wait; TWO: POST then GET ?wait, on the same server.
HTTP, TWO, BASE, LOCAL = "HTTP", "HTTP POST+GET", "HTTP baseline", "in-process"


@dataclass
class Result:
    backend: str
    tallies: dict[tuple[str, str], Tally] = field(default_factory=dict)  # (section, mode)
    one: dict[str, list[float]] = field(default_factory=dict)  # mode -> POST?wait ms
    two: dict[str, list[float]] = field(default_factory=dict)  # mode -> POST + GET?wait ms

    def tally(self, section: str, mode: str) -> Tally:
        return self.tallies.setdefault((section, mode), Tally())


def plan(args: argparse.Namespace) -> list[tuple[str, str, int, int]]:
    """(section, agent, runs, lanes) of one round: the sections asked for."""
    every = [
        ("seq code", CODE, args.runs, 1),
        ("seq code 1-step", CODE_ONE, args.runs, 1),
        ("seq graph", GRAPH, args.runs, 1),
        ("32 code", CODE, args.runs * 4, 32),
        ("256 code", CODE, 512, 256),
    ]
    return [s for s in every if s[0] in args.sections]


@dataclass
class Served:
    """One `lantern serve` and the client process that drives it."""

    server: ServerProcess
    client: ClientProcess | None = None

    async def start(self, admin_url: str) -> None:
        from lantern.server.auth import issue_key
        from lantern.store import open_store

        admin = open_store(admin_url)
        await admin.open()
        scopes = {"runs:execute", "runs:read", "agents:write"}
        _, key = await issue_key(admin, WORKSPACE, scopes)
        await admin.close()
        await asyncio.to_thread(self.server.start)
        async with httpx.AsyncClient(
            base_url=self.server.url, headers={"Authorization": f"Bearer {key}"}
        ) as h:
            (await h.put(f"/v1/agents/{GRAPH}", json=graph_definition())).raise_for_status()
        self.client = ClientProcess(self.server.port, key)

    async def batch(self, tally: Tally, steps: int, prefix: str, **kw: Any) -> dict[str, Any]:
        assert self.client is not None
        gc.collect()
        cpu = self.server.cpu_seconds()
        out = await self.client.batch(**kw, prefix=prefix)
        tally.add(steps, out, self.server.cpu_seconds() - cpu)
        return out

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        self.server.stop()


async def bench_backend(
    backend: str, urls: Sequence[str], tmp: Path, collector: int, args: argparse.Namespace
) -> Result:
    result = Result(backend)
    workers = args.workers if backend == "postgres" else 1  # SQLite serves with one
    log = tmp / f"serve-{backend}.log"
    servers = {HTTP: Served(ServerProcess(urls[0], log, collector, workers=workers))}
    if args.baseline:
        log = tmp / f"serve-{backend}-baseline.log"
        servers[BASE] = Served(ServerProcess(urls[2], log, collector, args.baseline))
    local = InProcess(urls[1])
    try:
        for served in servers.values():
            await served.start(served.server.database_url)
        await local.open()
        # Warm-up, untimed: connections, caches, prepared statements, each agent once.
        for agent, lanes in ((CODE, 1), (CODE_ONE, 1), (GRAPH, 1), (CODE, 32)):
            for mode, served in servers.items():
                for one_request in (True, False) if mode == HTTP else (True,):
                    await served.batch(
                        Tally(),
                        1,
                        f"warm-{agent}-{lanes}-{one_request}",
                        agent=agent,
                        count=40,
                        lanes=lanes,
                        one_request=one_request,
                    )
            await local.batch(agent, 40, lanes)
        for k in range(args.rounds):
            for section, agent, count, lanes in plan(args):
                steps = count * STEPS_OF[agent]
                # (mode, server, one request a run); None: in-process
                measures: list[tuple[str, Served | None, bool]] = [
                    (HTTP, servers[HTTP], True),
                    (TWO, servers[HTTP], False),
                    *((BASE, s, True) for m, s in servers.items() if m == BASE),
                    (LOCAL, None, True),
                ]
                if k % 2:  # A / B, then B / A
                    measures.reverse()
                for mode, measured, one_request in measures:
                    kw: dict[str, Any] = {"agent": agent, "count": count, "lanes": lanes}
                    tally = result.tally(section, mode)
                    if measured is not None:
                        prefix = f"r{k}-{section}-{mode}"
                        await measured.batch(tally, steps, prefix, one_request=one_request, **kw)
                    else:
                        gc.collect()
                        cpu = time.process_time()
                        out = await local.batch(agent, count, lanes)
                        tally.add(steps, out, time.process_time() - cpu)
            # POST -> finished for a 1-step run: one request, then two.
            # Interleaved as the sections above: which server goes first alternates by round.
            order = list(servers.items())[:: -1 if k % 2 else 1]
            for mode, served in order if "latency" in args.sections else ():
                for one_request, into in ((True, result.one), (False, result.two)):
                    out = await served.batch(
                        Tally(),
                        1,
                        f"r{k}-{one_request}",
                        agent=CODE_ONE,
                        count=args.runs,
                        lanes=1,
                        one_request=one_request,
                    )
                    into.setdefault(mode, []).extend(out["latencies"])
    finally:
        for served in servers.values():
            served.stop()
        await local.close()
    return result


@asynccontextmanager
async def sqlite_urls() -> AsyncIterator[tuple[list[str], Path]]:
    with tempfile.TemporaryDirectory(prefix="lantern-bench-service-") as tmp:
        yield [f"sqlite:///{tmp}/{name}.db" for name in ("http", "local", "base")], Path(tmp)


def describe_pg(url: str) -> str:
    info = conninfo_to_dict(url)
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


@asynccontextmanager
async def postgres_urls() -> AsyncIterator[tuple[list[str], Path] | None]:
    url = os.environ.get("LANTERN_BENCH_PG_URL", DEFAULT_PG_URL)
    try:
        admin = await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        print(f"postgres: skipped, {describe_pg(url)} did not answer: {' '.join(str(exc).split())}")
        yield None
        return
    schemas = [f"bench_service_{secrets.token_hex(4)}" for _ in range(3)]
    try:
        for schema in schemas:
            await admin.execute(f"CREATE SCHEMA {schema}")
        sep = "&" if "?" in url else "?"
        scoped = [f"{url}{sep}options=-csearch_path%3D{s}" for s in schemas]
        print(f"postgres: {describe_pg(url)}, schemas {', '.join(schemas)} (dropped at the end)")
        with tempfile.TemporaryDirectory(prefix="lantern-bench-service-") as tmp:
            yield scoped, Path(tmp)
    finally:
        for schema in schemas:
            await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()


# -- output ------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def marginal_us(ten: Tally, one: Tally) -> float:
    """(µs per 10-step run - µs per 1-step run) / 9."""
    per_ten = sum(r[1] for r in ten.rounds) / (ten.steps / STEPS)
    per_one = sum(r[1] for r in one.rounds) / one.steps
    return (per_ten - per_one) / (STEPS - 1) * 1e6


def report(results: Sequence[Result]) -> None:
    for r in results:
        # A mode measured in the latency section only (--sections latency) is shown too.
        modes = [
            m for m in (HTTP, TWO, BASE, LOCAL) if m in r.one or any(k[1] == m for k in r.tallies)
        ]
        # HTTP and the in-process figures are paired with each of the others, round by round.
        ratios = [(HTTP, LOCAL, "HTTP / in-proc"), (TWO, LOCAL, "POST+GET / in-proc")]
        if BASE in modes:
            ratios.append((HTTP, BASE, "HTTP / baseline"))
        print()
        print(f"{r.backend}: steps/s, CPU µs per step (server process; this one in-process);")
        print(f"HTTP: one request a run (POST ?wait); {TWO}: POST, then GET ?wait")
        head = f"{'section':16}" + "".join(f"{m:>26}" for m in modes)
        head += "".join(f"{name:>24}" for _, _, name in ratios)
        print(head + "  429s  target")
        print("-" * (len(head) + 22))
        for section in [s for s in SECTIONS if (s, HTTP) in r.tallies]:
            line = f"{section:16}"
            for m in modes:
                t = r.tally(section, m)
                line += f"{t.rate:>14,.0f} {t.cpu_us:>7,.0f} µs  "
            for a, b, _ in ratios:
                mid, low, high = ratio(r.tally(section, a), r.tally(section, b))
                line += f"{mid:>10.2f}x ({low:.2f}-{high:.2f})"
            target = "-"
            if section in ("seq code", "32 code"):
                mid = ratio(r.tally(section, HTTP), r.tally(section, LOCAL))[0]
                target = f"<= {RATIO_TARGET:g}x: " + ("met" if mid <= RATIO_TARGET else "MISSED")
            throttled = sum(r.tally(section, m).throttled for m in (HTTP, TWO, BASE) if m in modes)
            print(f"{line}{throttled:6}  {target}")
        both = all((s, HTTP) in r.tallies for s in ("seq code", "seq code 1-step"))
        for m in modes if both else ():
            ten, one = r.tally("seq code", m), r.tally("seq code 1-step", m)
            print(f"marginal µs per step (sequential), {m}: {marginal_us(ten, one):,.0f}")
        for m in [m for m in modes if m != LOCAL and m in r.one]:
            for name, values in (("POST?wait", r.one[m]), ("POST+GET?wait", r.two[m])):
                p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
                target = "-"
                if r.backend == "sqlite" and name == "POST?wait" and m == HTTP:
                    met = p50 < P50_TARGET_MS and p99 < P99_TARGET_MS
                    target = f"p50 < {P50_TARGET_MS:g}, p99 < {P99_TARGET_MS:g}: " + (
                        "met" if met else "MISSED"
                    )
                print(
                    f"1-step run, {m}, {name} -> finished: p50 {p50:.2f} ms,"
                    f" p99 {p99:.2f} ms ({len(values)} runs)  {target}"
                )
    print()
    print("ratio: time / time for the same steps, median over rounds (lowest-highest round);")
    print("CPU: user + system of the server process (HTTP) or of this process (in-process);")
    print("429s: requests the default per-key limit refused over HTTP, every path (waited out,")
    print("then sent again).")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds, default 3")
    p.add_argument("--runs", type=int, default=40, help="sequential runs per round, default 40")
    p.add_argument("--backends", default="both", help="sqlite, postgres or both (default)")
    p.add_argument(
        "--baseline",
        metavar="DIR",
        help="a checkout of another revision (git worktree add DIR REV): its `lantern serve`"
        " is measured too, interleaved, for before/after ratios in one run",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="`lantern serve --workers N` for PostgreSQL's HTTP server (not the baseline's);"
        " default 1",
    )
    p.add_argument(
        "--sections",
        default=",".join((*SECTIONS, "latency")),
        help="which to measure, comma-separated: "
        + ", ".join((*SECTIONS, "latency"))
        + " (default all); e.g. '32 code' alone for the concurrent path",
    )
    p.add_argument("--client", help=argparse.SUPPRESS)  # PORT:KEY of the client process
    p.add_argument("--collector", type=int, help=argparse.SUPPRESS)  # the collector's port
    args = p.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.backends == ["both"]:
        args.backends = ["sqlite", "postgres"]
    if not args.backends or set(args.backends) - {"sqlite", "postgres"}:
        p.error("--backends takes sqlite, postgres or both")
    args.sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    if not args.sections or set(args.sections) - {*SECTIONS, "latency"}:
        p.error("--sections takes " + ", ".join((*SECTIONS, "latency")))
    if args.rounds < 1 or args.runs < 1:
        p.error("--rounds and --runs must be at least 1")
    return args


async def main_async(args: argparse.Namespace) -> int:
    print(
        f"lantern {lantern.__version__}, Python {platform.python_version()}, {os.cpu_count()}"
        f" CPUs shared by the server, the client process, the database and this process (load"
        f" average {os.getloadavg()[0]:.1f} at the start: other work on the machine counts too)"
    )
    port = free_port()
    collector = await asyncio.to_thread(
        subprocess.Popen, [sys.executable, __file__, "--collector", str(port)]
    )
    results: list[Result] = []
    try:
        for backend in args.backends:
            urls = sqlite_urls() if backend == "sqlite" else postgres_urls()
            async with urls as found:
                if found is not None:
                    results.append(await bench_backend(backend, found[0], found[1], port, args))
    finally:
        collector.terminate()
        collector.wait()
    if results:
        report(results)
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.client:
        port, _, key = args.client.partition(":")
        asyncio.run(client_main(int(port), key))
        return 0
    if args.collector:
        collector_main(args.collector)
        return 0
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
