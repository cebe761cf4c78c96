"""Lantern's own overhead per model call: journal + budget gate + router.

Drives runs of ``--steps`` ai-steps in a chain (trigger -> m1 -> ... -> mN) in this process,
one run after another, on SQLite and PostgreSQL. Each ai-step names a route (so the router
resolves it) and the agent has a budget (so the gate checks every call); the model is
gpt-4o-mini on the fake provider of the tests: a real HTTP server on 127.0.0.1 that answers at
once, reached through the real OpenAI SDK.

The provider's own time is measured around every ``complete`` call and subtracted, so what
is left is Lantern's: per run, (run wall time - time inside the provider) / steps. That
includes each step's journal commit (its completion and the next step's start), the gate's
spend sum, the router, the templates and the run's lease and opening commit spread over its
steps. Target (issue 4): p50 under 2 ms per call on PostgreSQL.

    .venv/bin/python bench/llm.py [--runs 40] [--steps 10] [--backends sqlite,postgres]

``LANTERN_BENCH_PG_URL`` overrides the PostgreSQL URL (default the tests' database); the
bench works in a fresh schema and drops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import itertools

import lantern
from lantern.config import ModelSettings
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.models.records import ModelRequest, ModelResponse, OnText, Provider
from lantern.models.registry import Models
from lantern.store.base import Store, open_store
from tests.fake_llm import FakeProvider

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
TARGET_MS = 2.0


class Timed:
    """Wraps a provider and adds up the time spent inside it."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner
        self.name = inner.name
        self.spent = 0.0
        self.calls = 0

    async def complete(self, request: ModelRequest, on_text: OnText | None = None) -> ModelResponse:
        began = time.perf_counter()
        try:
            return await self.inner.complete(request, on_text)
        finally:
            self.spent += time.perf_counter() - began
            self.calls += 1

    async def aclose(self) -> None:
        await self.inner.aclose()


def chain(steps: int) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"}]
    edges = []
    previous = "start"
    for k in range(1, steps + 1):
        prompt = (
            "Summarise {{ input.text }}"
            if k == 1
            else f"Improve {{{{ steps.m{k - 1}.output.text }}}}"
        )
        nodes.append(
            {
                "id": f"m{k}",
                "type": "ai-step",
                "data": {"model": "route:bench", "prompt": prompt, "maxTokens": 64},
            }
        )
        edges.append({"source": previous, "target": f"m{k}"})
        previous = f"m{k}"
    return {
        "name": "bench-llm",
        "budget": {"maxUsd": 1000, "maxTokens": 10**9},
        "graph": {"nodes": nodes, "edges": edges},
    }


async def measure(store: Store, runs: int, steps: int) -> tuple[list[float], list[float]]:
    """Per run: Lantern's ms per model call, and the provider's ms per call."""
    models = Models.from_settings(ModelSettings.from_env())  # the bench's route (main_async)
    timed = Timed(models.provider("gpt-4o-mini"))
    models._providers["openai"] = timed  # the bench's stopwatch around the real provider
    await apply_agent(store, chain(steps))
    ours, theirs = [], []
    async with Worker(store, lantern.App(), worker_id="bench", lease_ttl=60, models=models) as w:
        assert w.runner is not None
        for n in range(runs + 3):  # three to warm up
            run = await create_run(store, "bench-llm", {"text": f"report {n}"})
            spent, calls = timed.spent, timed.calls
            began = time.perf_counter()
            done = await w.runner.drive(run.id)
            wall = time.perf_counter() - began
            assert done is not None and done.status == "succeeded", done
            assert timed.calls - calls == steps
            if n >= 3:
                inside = timed.spent - spent
                ours.append((wall - inside) / steps * 1000)
                theirs.append(inside / steps * 1000)
    await models.aclose()
    return ours, theirs


async def measure_noop(store: Store, runs: int, steps: int) -> list[float]:
    """The same chain of no-op tool steps: the journal's own cost per step, for scale."""
    app = lantern.App()

    @app.tool("noop")
    async def noop() -> None:
        return None

    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"}]
    nodes += [{"id": f"t{k}", "type": "tool", "data": {"tool": "noop"}} for k in range(steps)]
    edges = [{"source": a["id"], "target": b["id"]} for a, b in itertools.pairwise(nodes)]
    await apply_agent(store, {"name": "bench-noop", "graph": {"nodes": nodes, "edges": edges}})
    out = []
    async with Worker(store, app, worker_id="bench-noop", lease_ttl=60) as w:
        assert w.runner is not None
        for n in range(runs + 3):
            run = await create_run(store, "bench-noop", {})
            began = time.perf_counter()
            await w.runner.drive(run.id)
            if n >= 3:
                out.append((time.perf_counter() - began) / steps * 1000)
    return out


async def measure_both(store: Store, runs: int, steps: int) -> tuple[list[float], ...]:
    ours, theirs = await measure(store, runs, steps)
    return ours, theirs, await measure_noop(store, runs, steps)


def report(backend: str, ours: list[float], theirs: list[float], noop: list[float]) -> bool:
    q = statistics.quantiles(ours, n=10)
    p50, base = statistics.median(ours), statistics.median(noop)
    print(
        f"{backend:10} Lantern per model call: p50 {p50:.3f} ms  p90 {q[8]:.3f} ms"
        f"  (provider round trip p50 {statistics.median(theirs):.3f} ms, not counted)\n"
        f"{'':10} a no-op tool step, same chain: p50 {base:.3f} ms;"
        f" the model layer adds {p50 - base:+.3f} ms to it"
    )
    return p50 < TARGET_MS


# The fake runs in a process of its own: in this one its threads would hold the GIL against
# the event loop under measurement (a thread waits up to the 5 ms switch interval for it).
SERVE_FAKE = """
import sys
from tests.fake_llm import FakeProvider, Script
fake = FakeProvider(script=Script(["A short answer."])).start()
print(fake.url, flush=True)
sys.stdin.read()
"""


def start_fake() -> tuple[subprocess.Popen[str], dict[str, str]]:
    root = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_FAKE],
        cwd=root,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": root},
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url.startswith("http://"), "the fake provider did not start"
    env = FakeProvider.env_for(url)
    return proc, env


async def main_async(args: argparse.Namespace) -> int:
    fake, env = start_fake()
    os.environ.update(env)
    os.environ["LANTERN_MODEL_ROUTES"] = '{"bench": ["gpt-4o-mini"]}'
    print(
        f"bench/llm.py: {args.runs} runs x {args.steps} ai-steps,"
        f" Python {platform.python_version()}, {os.cpu_count()} cores;"
        f" target p50 < {TARGET_MS} ms per call on PostgreSQL"
    )
    ok = True
    try:
        for backend in args.backends.split(","):
            if backend == "sqlite":
                with tempfile.TemporaryDirectory() as tmp:
                    store = open_store(f"sqlite:///{tmp}/bench.db")
                    await store.open()
                    try:
                        report("sqlite", *await measure_both(store, args.runs, args.steps))
                    finally:
                        await store.close()
            else:
                url = os.environ.get("LANTERN_BENCH_PG_URL", DEFAULT_PG_URL)
                schema = f"bench_llm_{secrets.token_hex(4)}"
                try:
                    admin = await psycopg.AsyncConnection.connect(url, autocommit=True)
                except psycopg.OperationalError as exc:
                    print(f"postgres   skipped: {exc}")
                    continue
                await admin.execute(f"CREATE SCHEMA {schema}")
                try:
                    scoped = (
                        url + ("&" if "?" in url else "?") + f"options=-csearch_path%3D{schema}"
                    )
                    store = open_store(scoped)
                    await store.open()
                    try:
                        ok = (
                            report("postgres", *await measure_both(store, args.runs, args.steps))
                            and ok
                        )
                    finally:
                        await store.close()
                finally:
                    await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
                    await admin.close()
    finally:
        assert fake.stdin is not None
        fake.stdin.close()
        fake.wait(10)
    print("target met" if ok else "target NOT met")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--backends", default="sqlite,postgres")
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
