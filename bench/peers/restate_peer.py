"""Lantern behind `lantern serve` beside Restate, the same work over HTTP, in one interleaved run.

The work: a durable function of 10 no-op steps, invoked over HTTP and waited for.

- Lantern: ``lantern serve`` as ``bench/service.py`` starts it (default settings, tracing on
  exporting to a local collector, metrics on, text logs), with its code-first agent of 10
  no-op ``ctx.step`` calls; a client sends ``POST /v1/runs?wait=30`` (one request, answered
  with the finished run), on SQLite and on PostgreSQL.
- Restate: its server (``@restatedev/restate-server`` from the npm registry, the Rust binary
  with its own log and RocksDB, default configuration, a single node) and a service of the
  ``restate-sdk`` Python SDK served by hypercorn, whose handler makes 10 no-op ``ctx.run``
  calls; a client calls it through Restate's HTTP ingress (``POST /bench/ten``, answered when
  the handler finished), and Restate calls the service over HTTP/2.

Both are installed by this script into a cache directory (``~/.cache/lantern-bench/restate``,
or ``$LANTERN_BENCH_CACHE/restate``), not into the project: ``npm install`` of the server's
package (its binary ships inside the platform package) and a virtualenv with ``restate-sdk``
and ``hypercorn``. Neither is a dependency of Lantern.

Measured, round by round, each system in turn (the order rotates by round), from one client
process of keep-alive HTTP/1.1 connections (``bench/service.py``'s): 10-step invocations one at
a time and 32 at a time -> steps/s, and CPU per step: user + system of the serving processes
(Lantern: the ``lantern serve`` process; Restate: ``restate-server`` and the Python service
together). PostgreSQL's own processes are not counted, and Restate's storage is inside its
server, so the CPU column favours Lantern on PostgreSQL. Ratios are Lantern's steps/s over
Restate's for the same section, the median of the rounds' ratios. Targets (issue 26): Lantern
on SQLite at least 2x Restate, sequential and 32 at a time; on PostgreSQL ahead of it.

    .venv/bin/python bench/peers/restate_peer.py [--rounds 3] [--runs 40] [--backends sqlite]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # bench/, for service.py
sys.path.insert(0, str(HERE.parent.parent))  # the repository, for lantern

import service  # noqa: E402  (bench/service.py)

import lantern  # noqa: E402

RESTATE_VERSION = "1.7.12"  # @restatedev/restate-server, the figures name it
SDK = ("restate-sdk>=1.3", "hypercorn>=0.17")
STEPS = service.STEPS
RESTATE = "Restate"
SECTIONS = ("seq", "32")
LANES = {"seq": 1, "32": 32}
SERVICE_SOURCE = f'''
"""The Restate side of bench/peers/restate_peer.py: {STEPS} no-op ctx.run calls."""
import restate

bench = restate.Service("bench")


async def noop() -> None:
    return None


@bench.handler()
async def ten(ctx: restate.Context, n: int) -> int:
    for k in range(1, {STEPS} + 1):
        await ctx.run_typed(f"s{{k}}", noop)
    return n  # an answer to check (an empty one has no JSON body)


app = restate.app(services=[bench])
'''


def cache_dir() -> Path:
    base = os.environ.get("LANTERN_BENCH_CACHE") or Path.home() / ".cache" / "lantern-bench"
    return Path(base) / "restate"


def install(cache: Path) -> tuple[Path, Path]:
    """The restate-server binary and the SDK's Python, installed into ``cache`` once."""
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob("node_modules/@restatedev/restate-server-*/bin/restate-server"))
    if not found:
        npm = shutil.which("npm")
        if npm is None:
            raise SystemExit("restate: npm is not installed (the server comes from npm)")
        print(f"restate: installing @restatedev/restate-server@{RESTATE_VERSION} into {cache}")
        subprocess.run(
            [
                *(npm, "install", "--prefix", str(cache), "--no-audit", "--no-fund"),
                *("--ignore-scripts", f"@restatedev/restate-server@{RESTATE_VERSION}"),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        found = sorted(cache.glob("node_modules/@restatedev/restate-server-*/bin/restate-server"))
        if not found:
            raise SystemExit(f"restate: npm installed no server binary for {platform.machine()}")
    python = cache / "venv" / "bin" / "python"
    if not (cache / "venv" / ".installed").exists():
        print(f"restate: installing {', '.join(SDK)} into {cache / 'venv'}")
        subprocess.run([sys.executable, "-m", "venv", str(cache / "venv")], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *SDK], check=True)
        (cache / "venv" / ".installed").touch()
    (cache / "bench_service.py").write_text(SERVICE_SOURCE)
    return found[-1], python


class RestateProcesses:
    """restate-server on its own ports and data directory, and the Python service under
    hypercorn, registered with the server as a deployment."""

    def __init__(self, binary: Path, python: Path, tmp: Path) -> None:
        self.binary, self.python, self.tmp = binary, python, tmp
        self.ingress, self.admin, self.node, self.deployment = (
            service.free_port() for _ in range(4)
        )
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        env = {
            **os.environ,
            "RESTATE_LISTEN_MODE": "tcp",
            "RESTATE_DISABLE_TELEMETRY": "true",  # it would phone home; nothing else changed
            "RESTATE_INGRESS__BIND_ADDRESS": f"127.0.0.1:{self.ingress}",
            "RESTATE_ADMIN__BIND_ADDRESS": f"127.0.0.1:{self.admin}",
            "RESTATE_BIND_ADDRESS": f"127.0.0.1:{self.node}",
            "RESTATE_ADVERTISED_ADDRESS": f"http://127.0.0.1:{self.node}/",
        }
        data = self.tmp / "restate-data"
        with (self.tmp / "restate.log").open("ab") as out:
            self.procs.append(
                subprocess.Popen(
                    [str(self.binary), "--no-logo", "--base-dir", str(data)],
                    env=env,
                    cwd=self.tmp,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        with (self.tmp / "service.log").open("ab") as out:
            self.procs.append(
                subprocess.Popen(
                    [
                        *(str(self.python), "-m", "hypercorn", "--bind"),
                        *(f"127.0.0.1:{self.deployment}", "bench_service:app"),
                    ],
                    cwd=self.binary_cache,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        self._until(f"http://127.0.0.1:{self.admin}/health", "restate-server")
        deadline = time.monotonic() + 60
        while True:  # the service's port opens, and the server discovers it over HTTP/2
            try:
                r = httpx.post(
                    f"http://127.0.0.1:{self.admin}/deployments",
                    json={"uri": f"http://127.0.0.1:{self.deployment}", "force": True},
                    timeout=10,
                )
                if r.status_code in (200, 201):
                    break
                problem = f"{r.status_code} {r.text[:300]}"
            except httpx.HTTPError as exc:
                problem = str(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"restate: the service did not register: {problem}")
            time.sleep(0.2)
        self._until(f"http://127.0.0.1:{self.ingress}/restate/health", "the ingress")

    @property
    def binary_cache(self) -> Path:
        return self.python.parent.parent.parent  # <cache>/venv/bin/python -> <cache>

    def _until(self, url: str, what: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    log = (self.tmp / "restate.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"restate: a process exited ({p.args!r}): {log}")
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"restate: {what} did not answer {url}")

    def cpu_seconds(self) -> float:
        return sum(service.process_cpu(p.pid) for p in self.procs)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


# -- the client process of the Restate side ----------------------------------------------------


async def restate_client(port: int) -> None:
    """One JSON line per command line on stdin: ``count`` invocations, ``lanes`` at a time."""
    pool: list[service.Connection] = []
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        spec = json.loads(line)
        while len(pool) < spec["lanes"]:
            pool.append(service.Connection(port, "-"))
        out = await invocations(pool[: spec["lanes"]], spec["count"])
        print(json.dumps(out), flush=True)
    for c in pool:
        await c.close()


async def invocations(conns: Sequence[service.Connection], count: int) -> dict[str, Any]:
    """``count`` invocations of ``bench/ten``, ``len(conns)`` in flight until all finished."""
    todo = list(range(count))
    latencies: list[float] = []

    async def lane(conn: service.Connection) -> None:
        while todo:
            n = todo.pop()
            started = time.perf_counter()
            answer = await conn.request("POST", "/bench/ten", json.dumps(n).encode())
            if answer != n:
                raise RuntimeError(f"invocation {n} answered {answer!r}")
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(lane(c) for c in conns))
    return {"latencies": latencies, "elapsed": time.perf_counter() - started, "throttled": 0}


class RestateClient(service.ClientProcess):
    def __init__(self, port: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--client", str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )


# -- the run -----------------------------------------------------------------------------------


class System:
    """One side of the comparison: starts, runs a batch, reports its serving CPU."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tallies = {s: service.Tally() for s in SECTIONS}

    async def batch(self, section: str, count: int) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class LanternSystem(System):
    def __init__(self, name: str, url: str, tmp: Path, collector: int) -> None:
        super().__init__(name)
        self.served = service.Served(service.ServerProcess(url, tmp / f"{name}.log", collector))
        self.url = url

    async def start(self) -> None:
        await self.served.start(self.served.server.database_url)

    async def batch(self, section: str, count: int) -> None:
        await self.served.batch(
            self.tallies[section],
            count * STEPS,
            f"{section}-{time.monotonic_ns()}",
            agent=service.CODE,
            count=count,
            lanes=LANES[section],
            one_request=True,
        )

    def stop(self) -> None:
        self.served.stop()


class RestateSystem(System):
    def __init__(self, procs: RestateProcesses) -> None:
        super().__init__(RESTATE)
        self.procs = procs
        self.client: RestateClient | None = None

    async def start(self) -> None:
        await asyncio.to_thread(self.procs.start)
        self.client = RestateClient(self.procs.ingress)

    async def batch(self, section: str, count: int) -> None:
        assert self.client is not None
        cpu = self.procs.cpu_seconds()
        out = await self.client.batch("ten", count, LANES[section], "-")
        self.tallies[section].add(count * STEPS, out, self.procs.cpu_seconds() - cpu)

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        self.procs.stop()


def report(systems: Sequence[System], versions: str) -> None:
    print()
    print(f"steps/s and serving CPU µs per step, {STEPS}-step functions over HTTP ({versions})")
    restate = next((s for s in systems if s.name == RESTATE), None)
    head = f"{'system':22}" + "".join(f"{s:>26}" for s in ("one at a time", "32 at a time"))
    if restate is not None:
        head += f"{'vs Restate (seq, 32)':>28}"
    print(head)
    print("-" * len(head))
    for system in systems:
        line = f"{system.name:22}"
        for section in SECTIONS:
            t = system.tallies[section]
            line += f"{t.rate:>14,.0f} {t.cpu_us:>7,.0f} µs  "
        if restate is not None and system is not restate:
            ratios = []
            for section in SECTIONS:
                mine, theirs = system.tallies[section], restate.tallies[section]
                per = [b / a for a, b in zip(mine.per_round(), theirs.per_round(), strict=True)]
                ratios.append(f"{statistics.median(per):.2f}x")
            line += f"{', '.join(ratios):>28}"
        print(line)
    print()
    print("vs Restate: Lantern's steps/s / Restate's, median of the rounds (>1: Lantern faster);")
    print("targets: SQLite >= 2x at both, PostgreSQL > 1x. CPU: lantern serve; restate-server")
    print("and the Python service together (PostgreSQL's own processes not counted).")


def versions(binary: Path, python: Path) -> tuple[str, str]:
    version = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    sdk = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('restate-sdk'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return version, sdk


async def main_async(args: argparse.Namespace, binary: Path, python: Path) -> int:
    version, sdk = versions(binary, python)
    print(
        f"{version}, restate-sdk {sdk}; lantern {lantern.__version__}; Python"
        f" {platform.python_version()}; {os.cpu_count()} CPUs (load average"
        f" {os.getloadavg()[0]:.1f} at the start)"
    )
    port = service.free_port()
    collector = await asyncio.to_thread(
        subprocess.Popen, [sys.executable, service.__file__, "--collector", str(port)]
    )
    systems: list[System] = []
    try:
        async with AsyncExitStack() as stack:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lantern-peers-")))
            for backend in args.backends:
                urls = service.sqlite_urls() if backend == "sqlite" else service.postgres_urls()
                found = await stack.enter_async_context(urls)
                if found is not None:
                    served = LanternSystem(f"Lantern ({backend})", found[0][0], tmp, port)
                    systems.append(served)
                    stack.callback(served.stop)
                    await served.start()
            restate = RestateSystem(RestateProcesses(binary, python, tmp))
            systems.append(restate)
            stack.callback(restate.stop)
            await restate.start()
            for system in systems:  # warm-up, untimed
                for section in SECTIONS:
                    await system.batch(section, 40)
                    system.tallies[section] = service.Tally()
            for k in range(args.rounds):
                turn = systems[k % len(systems) :] + systems[: k % len(systems)]
                for section in SECTIONS:
                    count = args.runs if section == "seq" else args.runs * 4
                    for system in turn:
                        await system.batch(section, count)
    finally:
        collector.terminate()
        collector.wait()
    report(systems, f"{version}, restate-sdk {sdk}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds, default 3")
    p.add_argument("--runs", type=int, default=40, help="sequential runs per round, default 40")
    p.add_argument("--backends", default="sqlite,postgres", help="Lantern's: sqlite, postgres")
    p.add_argument("--client", type=int, help=argparse.SUPPRESS)  # the ingress port
    args = p.parse_args(argv)
    if args.client:
        asyncio.run(restate_client(args.client))
        return 0
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if set(args.backends) - {"sqlite", "postgres"}:
        p.error("--backends takes sqlite, postgres or both")
    if args.rounds < 1 or args.runs < 1:
        p.error("--rounds and --runs must be at least 1")
    binary, python = install(cache_dir())
    return asyncio.run(main_async(args, binary, python))


if __name__ == "__main__":
    sys.exit(main())
