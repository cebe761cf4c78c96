"""The microVM tier's figures, per driver, with real `lantern serve` and `lantern node` processes.

For each driver that works here (``--drivers``, default every one ``lantern runtime check``
finds working):

- **placement -> first step**: from ``vm_scheduled`` to the workload's first ``step_started``
  (journal times), p50 and p99 over ``--runs`` runs one after another;
- **VM start**: from ``vm_scheduled`` to ``vm_started`` (the runtime node took the placement,
  took the run lease, booted the VM), p50 and p99;
- **VMs at once at 128 MB**: ``--burst`` runs of a workload that holds its VM, on one runtime
  node with room for all of them; the most VMs that were ``running`` together;
- **node loss -> resumed first step**: two runtime nodes, the one running a VM is SIGKILLed
  mid-step; from the kill to the resumed VM's first ``step_started``, against
  ``LANTERN_NODE_TTL`` + 2 s.

Warm VMs (``--warm``, default the driver's: 1 for qemu): with a pool, each run starts once the
node has a warm VM ready (a node between placements, not one taking a burst), and its
"VM start" is the take of that VM. ``--warm 0`` measures cold boots.

**Per VM call** (``--calls N``, default 50; 0 skips it): database round trips and wall time the
control plane spends per ``ctx.step`` and per ``ctx.model`` of a VM, on SQLite and PostgreSQL
(the relay driven in this process as a runtime node drives it, each request authenticated
under the VM's token, on a real store whose calls are counted: each is at least one round trip;
a ``ctx.step`` is two requests, which attempt to run and what it did; a ``ctx.model`` one, to
``offline/echo``). ``--drivers none`` prints
only these.

Targets (issue 16): sandbox start under 50 ms, gvisor under 1.5 s, qemu under 3 s with
software emulation; resume after node loss within LANTERN_NODE_TTL + 2 s. The machine's load
shows in every figure alike; compare drivers as ratios within one run.

    .venv/bin/python bench/vms.py [--drivers sandbox,gvisor,qemu|none] [--runs 20] [--burst 16]
                                  [--warm N] [--calls 50]

**What the sandbox's hardening costs** (``--hardening N``, alone): N VMs of the ``sandbox``
driver as it is (user namespace, nobody, no capabilities, seccomp filter) and N without those
options (bubblewrap as it ran before, root's capabilities kept), alternated, driven in this
process: VM start (spawn -> the harness's first question) and first step (spawn -> the first
request of its first step), p50/p99 each and their ratio hardened/unhardened (target: at most 1.2).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import re
import secrets
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from lantern.durations import parse_duration  # noqa: E402
from lantern.engine.runs import apply_agent, create_run  # noqa: E402
from lantern.runtime.channel import serve  # noqa: E402
from lantern.runtime.drivers import DRIVERS, VmSpec, probe, use_image  # noqa: E402
from lantern.runtime.drivers.sandbox import SandboxDriver  # noqa: E402
from lantern.runtime.image import build  # noqa: E402
from lantern.runtime.relay import Relay, digest, new_token  # noqa: E402
from lantern.store import Store, open_store  # noqa: E402
from lantern.store.runtime import SCHEDULER, Vm  # noqa: E402
from tests.runtime.cluster import FAST, Cluster  # noqa: E402
from tests.runtime.vms import APPS  # noqa: E402

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


def at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["at"]).timestamp()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def first(events: list[dict[str, Any]], kind: str, after: float = 0) -> dict[str, Any] | None:
    return next((e for e in events if e["kind"] == kind and at(e) >= after), None)


def warm_ready(node: Any, count: int) -> None:
    """Wait until the node has booted ``count`` warm VMs in all (its log says each)."""
    deadline = time.monotonic() + 300
    while ready(node) < count:
        assert time.monotonic() < deadline, "no warm VM got ready"
        time.sleep(0.2)


def ready(node: Any) -> int:
    return len(re.findall(r"warm VM \S+ ready in", node.log.read_text()))


def latencies(cluster: Cluster, runs: int, node: Any, warm: int) -> tuple[list[float], list[float]]:
    to_step, to_start = [], []
    for i in range(runs):
        if warm:
            warm_ready(node, i + 1)
        run_id = cluster.start_run("one", {})
        run = cluster.finished(run_id, timeout=300)
        assert run["status"] == "succeeded", run
        events = cluster.events(run_id)
        placed = first(events, "vm_scheduled")
        started = first(events, "vm_started")
        step = first(events, "step_started")
        assert placed and started and step
        to_step.append(at(step) - at(placed))
        to_start.append(at(started) - at(placed))
    return to_step, to_start


def burst(cluster: Cluster, n: int) -> int:
    ids = [cluster.start_run("hold", {"seconds": 20}) for _ in range(n)]
    most = 0
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        states = [v["state"] for run_id in ids for v in cluster.vms(run_id)]
        most = max(most, states.count("running"))
        runs = [cluster.ok("GET", f"/v1/runs/{r}")["status"] for r in ids]
        if all(s in ("succeeded", "failed") for s in runs):
            return most
        time.sleep(0.5)
    return most


def node_loss(cluster: Cluster, nodes: dict[str, Any]) -> float:
    run_id = cluster.start_run("hold", {"seconds": 120})
    cluster.wait_for(
        lambda: len([e for e in cluster.events(run_id) if e["kind"] == "step_started"]) >= 2, 300
    )
    [vm] = cluster.vms(run_id)
    killed = time.time()
    nodes[vm["nodeId"]].signal(signal.SIGKILL)
    cluster.finished(run_id, timeout=300)
    resumed = first(cluster.events(run_id), "step_started", after=killed)
    assert resumed is not None
    return at(resumed) - killed


def bench(driver: str, runs: int, n: int, image: Path, warm: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lantern-bench-vms-") as tmp:
        cluster = Cluster(f"sqlite:///{tmp}/lantern.db", Path(tmp)).serve()
        env = {"LANTERN_DATA_DIR": str(image.parent)}  # the qemu driver's image is under it
        try:
            cluster.agent("one", "bench_jobs:one", driver=driver, memoryMb=128)
            cluster.agent("hold", "bench_jobs:hold", driver=driver, memoryMb=128)
            pool = DRIVERS[driver].warm if warm is None else warm
            opts: dict[str, Any] = {"warm": pool, "args": ("--warm-memory-mb", "128")}
            a = cluster.node(f"{driver}-a", driver=driver, capacity=max(n, 2), env=env, **opts)
            to_step, to_start = latencies(cluster, runs, a, pool)
            most = burst(cluster, n)
            b = cluster.node(f"{driver}-b", driver=driver, env=env, **opts)
            time.sleep(2)
            if pool:
                warm_ready(b, 1)
            loss = node_loss(cluster, {a.node_id: a, b.node_id: b})
        finally:
            cluster.close()
    return {"to_step": to_step, "to_start": to_start, "burst": most, "loss": loss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--drivers", default="")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--burst", type=int, default=16)
    parser.add_argument("--warm", type=int, default=None, help="warm VMs per node")
    parser.add_argument("--calls", type=int, default=50, help="VM calls measured per kind")
    parser.add_argument("--hardening", type=int, default=0, help="sandbox VMs per variant")
    args = parser.parse_args()
    print(f"host: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    if args.hardening:
        asyncio.run(hardening(args.hardening))
        return
    if args.calls:
        asyncio.run(per_call(args.calls))
    if args.drivers == "none":
        return
    image = Path(tempfile.mkdtemp(prefix="lantern-bench-image-")) / "runtime"
    build(image)
    use_image(image)
    names = [d for d in args.drivers.split(",") if d] or [
        d.name for d in DRIVERS.values() if asyncio.run(probe(d)).works
    ]
    ttl = parse_duration(FAST["LANTERN_NODE_TTL"])
    print(f"LANTERN_NODE_TTL {ttl:g} s")
    header = ("driver", "-> first step p50/p99", "VM start p50/p99", "at once @128MB", "node loss")
    print(f"{header[0]:8} {header[1]:>22} {header[2]:>18} {header[3]:>15} {header[4]:>10}")
    for name in names:
        r = bench(name, args.runs, args.burst, image, args.warm)
        step = f"{ms(r['to_step'], 0.5)}/{ms(r['to_step'], 0.99)} ms"
        start = f"{ms(r['to_start'], 0.5)}/{ms(r['to_start'], 0.99)} ms"
        held = f"{r['burst']}/{args.burst}"
        print(f"{name:8} {step:>22} {start:>18} {held:>15} {r['loss']:>8.2f} s")


async def per_call(calls: int) -> None:
    """Round trips and wall time per VM call, on each backend that answers."""
    print(f"{'per VM call':24} {'round trips':>11} {'wall':>9}  store calls")
    with tempfile.TemporaryDirectory(prefix="lantern-bench-calls-") as tmp:
        rows = [("sqlite", await measure(f"sqlite:///{tmp}/calls.db", calls))]
    url = os.environ.get("LANTERN_BENCH_PG_URL", DEFAULT_PG_URL)
    schema = f"bench_{secrets.token_hex(4)}"
    try:
        admin = await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        print(f"postgres: skipped, it did not answer: {' '.join(str(exc).split())}")
    else:
        try:
            await admin.execute(f"CREATE SCHEMA {schema}")
            scoped = url + ("&" if "?" in url else "?") + f"options=-csearch_path%3D{schema}"
            rows.append(("postgres", await measure(scoped, calls)))
        finally:
            await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            await admin.close()
    for backend, costs in rows:
        for kind, cost in costs.items():
            by = ", ".join(f"{k} {v:g}" for k, v in cost.by_method.items())
            name = f"{backend} {kind}"
            print(f"{name:24} {cost.round_trips:>11.2f} {cost.ms:>6.2f} ms  {by}")


AGENT = {"name": "bench-vm", "runtime": {"tier": "microvm", "entrypoint": "bench_jobs:one"}}


class Counting:
    """A store that counts the calls made to it, by method."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(found):
            return found

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return await found(*args, **kwargs)

        return counted


@dataclass
class Cost:
    round_trips: float  # store calls per VM call
    ms: float  # wall time per VM call
    by_method: dict[str, float]


async def measure(url: str, calls: int) -> dict[str, Cost]:
    """Per ``ctx.step`` and per ``ctx.model`` of a VM whose run is on the store at ``url``."""
    store = open_store(url)
    await store.open()
    try:
        counted = Counting(store)
        relay = Relay(cast(Store, counted), patience=5)
        token = await _placed(store)
        vm = await relay.authenticate(f"Bearer {token}")
        await relay.steps(vm)  # the VM's first question: its drive is folded once, here
        position = 0

        async def step() -> None:
            nonlocal position
            position += 1
            body = {"stepId": f"s{position}", "position": position}
            vm = await relay.authenticate(f"Bearer {token}")
            answer = await relay.step(vm, body)
            # As the route has it: an outcome always ends in a fenced commit.
            vm = await relay.authenticate(f"Bearer {token}", commits=True)
            await relay.step(vm, {**body, "attempt": answer["attempt"], "output": position})

        async def model() -> None:
            nonlocal position
            position += 1
            call = {"kind": "model", "model": "offline/echo", "prompt": "hi"}
            vm = await relay.authenticate(f"Bearer {token}")
            await relay.call(vm, {"stepId": f"m{position}", "position": position, "call": call})

        return {
            "ctx.step": await _cost(counted, step, calls),
            "ctx.model": await _cost(counted, model, calls),
        }
    finally:
        await store.close()


async def _cost(counted: Counting, once: Callable[[], Awaitable[None]], calls: int) -> Cost:
    await once()  # warm: the first of a kind may read what later ones keep
    counted.calls.clear()
    started = time.perf_counter()
    for _ in range(calls):
        await once()
    took = time.perf_counter() - started
    total = sum(counted.calls.values())
    by = {k: v / calls for k, v in sorted(counted.calls.items())}
    return Cost(total / calls, took / calls * 1000, by)


async def _placed(store: Store) -> str:
    """A run of a microVM agent with a live VM taken by its runtime node; the VM's token."""
    await apply_agent(store, AGENT)
    run = await create_run(store, "bench-vm", {})
    leader = await store.acquire_named_lease(SCHEDULER, "bench", 600)
    assert leader is not None
    vm_id = f"vm_bench{secrets.token_hex(4)}"
    row = Vm(vm_id, run.id, "bench-node", "sandbox", 1, "scheduled", 128, datetime.now(UTC))
    assert await store.place_vm(leader, row)
    lease = await store.acquire_lease(run.id, "bench-node", 600)
    assert lease is not None
    token = new_token(vm_id, secrets.token_urlsafe(16))
    assert await store.take_vm(vm_id, "bench-node", digest(token), lease.epoch)
    return token


def ms(values: list[float], q: float) -> str:
    return f"{pct(values, q) * 1000:.0f}"


class Unhardened(SandboxDriver):
    """The sandbox driver without its hardening options: the "before" of ``--hardening``."""

    def argv(self, spec: VmSpec, seccomp_fd: int) -> list[str]:
        args = super().argv(spec, seccomp_fd)
        hardening = (("--unshare-user", 0), ("--uid", 1), ("--gid", 1), ("--cap-drop", 1),
                     ("--disable-userns", 0), ("--seccomp", 1))  # fmt: skip
        for option, values in hardening:
            at = args.index(option)
            del args[at : at + 1 + values]
        return args


async def one_vm(driver: SandboxDriver, workdir: Path) -> tuple[float, float]:
    """Seconds from spawn to the harness's first question, and to its first step's first word."""
    seen: dict[str, float] = {}

    async def handle(op: str, request: dict[str, Any]) -> Any:
        now = time.perf_counter()
        if op == "hello":
            seen.setdefault("hello", now)
            return {"runId": "bench", "entrypoint": "jobs:three", "input": {}}
        if op == "steps":
            return {"steps": []}
        seen.setdefault("step", now)  # the first thing its first step says
        return None

    started = time.perf_counter()
    spec = VmSpec(f"bench-{secrets.token_hex(6)}", APPS, workdir=workdir, memory_mb=256)
    vm = await driver.start(spec)
    try:
        await asyncio.wait_for(asyncio.gather(serve(vm, handle), vm.wait()), 60)
    finally:
        vm.kill()
    return seen["hello"] - started, seen["step"] - started


async def hardening(n: int) -> None:
    variants: dict[str, SandboxDriver] = {"hardened": SandboxDriver(), "unhardened": Unhardened()}
    figures: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in variants}
    with tempfile.TemporaryDirectory(prefix="lantern-bench-") as tmp:
        for i in range(n):
            for name, driver in variants.items():
                start, step = await one_vm(driver, Path(tmp) / f"{name}-{i}")
                figures[name][0].append(start)
                figures[name][1].append(step)
    print(f"sandbox hardening, {n} VMs each, alternated")
    print(f"{'variant':11} {'VM start p50/p99':>20} {'first step p50/p99':>20}")
    for name, (starts, steps) in figures.items():
        to_start = f"{ms(starts, 0.5)}/{ms(starts, 0.99)} ms"
        to_step = f"{ms(steps, 0.5)}/{ms(steps, 0.99)} ms"
        print(f"{name:11} {to_start:>20} {to_step:>20}")
    (hs, hf), (us, uf) = figures["hardened"], figures["unhardened"]
    print(
        f"ratio hardened/unhardened: VM start p50 {pct(hs, 0.5) / pct(us, 0.5):.2f}, "
        f"first step p50 {pct(hf, 0.5) / pct(uf, 0.5):.2f}"
    )


if __name__ == "__main__":
    main()
