"""Before and after, in one run: the per-step cost of driving runs with two builds of Lantern.

``bench/steps.py --compare REF`` (or this script directly) extracts the ``lantern`` package of
the git revision REF into a temporary directory and measures it against the working tree,
interleaved: in each of ``--rounds`` rounds, for each backend and each kind of agent, one
child process per build (the order alternating round by round, so drift on a shared machine
hits both alike) drives ``--runs`` sequential runs and reports

- µs/step: wall time of the timed runs over the steps they ran;
- CPU µs/step: the child process's CPU time (user + system, all its threads: the event
  loop, SQLite's thread, psycopg) over the same steps; the database server's is not in it.

With ``BENCH_CALLS=1`` each child instead counts the Python function calls per step under
cProfile: a measure of the work done that a loaded machine does not disturb. With
``BENCH_TRACING=1`` both builds trace every step (an SDK tracer provider, its spans batched,
OTLP-encoded and dropped, as ``--observability`` has it), to compare what tracing costs in each.

The kinds: a graph agent of 10 no-op tool steps after its trigger, a code-first agent making
the same 10 no-op steps as ``ctx.step`` calls (both builds must have ``App.agent``), and a
plain agent of 11
steps (5 model turns that each ask for the no-op tool, 5 tool calls, a last turn), its model
a scripted in-process provider so no network or key is involved. The child imports whichever
``lantern`` is first on its PYTHONPATH and uses only APIs both builds have.

    .venv/bin/python bench/steps.py --compare main [--runs 40] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("graph", "plain", "code")
GRAPH_STEPS = 10
PLAIN_TOOL_TURNS = 5
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


# -- the child: one build, one backend, one kind -------------------------------------------


def graph_agent() -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"}]
    edges = []
    previous = "start"
    for k in range(1, GRAPH_STEPS + 1):
        nodes.append({"id": f"t{k}", "type": "tool", "data": {"tool": "noop", "args": {}}})
        edges.append({"source": previous, "target": f"t{k}"})
        previous = f"t{k}"
    return {"name": "bench-graph", "graph": {"nodes": nodes, "edges": edges}}


def plain_agent() -> dict[str, Any]:
    return {"name": "bench-plain", "model": "offline/echo", "tools": ["noop"], "maxTurns": 10}


class ScriptedProvider:
    """Stands in for the offline provider: turns 1..5 ask for the no-op tool, then it answers."""

    name = "offline"

    async def aclose(self) -> None:
        pass

    async def complete(self, request: Any, on_text: Any = None) -> Any:
        from lantern.models.records import ModelResponse, TokenUsage, ToolCall

        turn = sum(1 for m in request.messages if m.role == "assistant") + 1
        calls = (ToolCall(f"call_{turn}", "noop", {}),) if turn <= PLAIN_TOOL_TURNS else ()
        return ModelResponse(
            text="" if calls else "done",
            model=request.model,
            provider=self.name,
            usage=TokenUsage(10, 2),
            tool_calls=calls,
        )


def trace_everything() -> None:
    """Tracing on, as ``bench/steps.py --observability`` has it: an SDK tracer provider with the
    build's ``lantern serve`` resource and a BatchSpanProcessor whose exporter encodes each
    batch as the build's ``lantern serve`` does and drops the bytes (the network is not
    measured)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    from lantern.observability import tracing

    try:
        from lantern.observability.otlp import encode
    except ImportError:  # a build from before it: the library's encoding only
        encode = None  # type: ignore[assignment]

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            if encode is None or encode(spans) is None:
                encode_spans(spans).SerializePartialToString()
            return SpanExportResult.SUCCESS

    provider = TracerProvider(resource=tracing.resource("bench"))
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    tracing.install(provider)


async def child(backend: str, kind: str, runs: int, warmup: int) -> dict[str, Any]:
    import lantern
    from lantern.engine.runs import apply_agent, create_run
    from lantern.engine.worker import Worker
    from lantern.models import registry
    from lantern.store import open_store

    app = lantern.App()
    if os.environ.get("BENCH_TRACING"):
        trace_everything()

    @app.tool("noop")
    async def noop() -> None:
        return None

    if kind == "code":

        @app.agent("bench-code")
        async def code(ctx: Any, i: int) -> None:
            for k in range(1, GRAPH_STEPS + 1):
                await ctx.step(f"t{k}", noop)

    # The scripted model: a build's own model registry (given to the worker), or, in a build
    # older than that, the process-wide one every worker used.
    given: dict[str, Any] = {}
    if hasattr(registry, "default"):
        registry.default()._providers["offline"] = ScriptedProvider()
    else:
        given["models"] = registry.Models(providers={"offline": ScriptedProvider()})
    with tempfile.TemporaryDirectory() as tmp:
        schema = None
        if backend == "sqlite":
            url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        else:
            import psycopg

            base = os.environ.get("LANTERN_BENCH_PG_URL", DEFAULT_PG_URL)
            schema = f"cmp_{secrets.token_hex(4)}"
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA {schema}")
            url = base + ("&" if "?" in base else "?") + f"options=-csearch_path%3D{schema}"
        store = open_store(url)
        await store.open()
        try:
            if kind == "code":
                name = "bench-code"
            else:
                definition = graph_agent() if kind == "graph" else plain_agent()
                await apply_agent(store, definition)
                name = definition["name"]
            ids = [
                (await create_run(store, name, "go" if kind == "plain" else {"i": i}, app=app)).id
                for i in range(warmup + runs)
            ]
            async with Worker(store, app, worker_id="bench", lease_ttl=60, **given) as w:
                runner = w.runner
                assert runner is not None
                for run_id in ids[:warmup]:
                    await runner.drive(run_id)
                steps = 0
                profile = cProfile.Profile() if os.environ.get("BENCH_CALLS") else None
                wall0, cpu0 = time.perf_counter(), time.process_time()
                if profile is not None:
                    profile.enable()
                for run_id in ids[warmup:]:
                    run = await runner.drive(run_id)
                    if run is None or run.status != "succeeded":
                        raise RuntimeError(f"run {run_id}: {run and (run.status, run.error)}")
                if profile is not None:
                    profile.disable()
                wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
                # Stats.total_calls is set by load_stats; typeshed's stub leaves it out.
                stats = pstats.Stats(profile) if profile is not None else None
                calls = stats.total_calls if stats is not None else 0  # type: ignore[attr-defined]
            for run_id in ids[warmup:]:
                steps += sum(1 for e in await store.events(run_id) if e.kind == "step_completed")
        finally:
            await store.close()
            if schema is not None:
                import psycopg

                with psycopg.connect(base, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    return {
        "us_per_step": wall / steps * 1e6,
        "cpu_us_per_step": cpu / steps * 1e6,
        "steps": steps,
        "calls_per_step": calls / steps,
        "lantern": str(Path(lantern.__file__).parent),
    }


# -- the parent: interleaved rounds ----------------------------------------------------------


def extract(ref: str, into: Path) -> Path:
    """The ``lantern`` package of git revision ``ref``, under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "lantern"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def measure(tree: Path, backend: str, kind: str, runs: int, warmup: int) -> dict[str, Any]:
    args = [sys.executable, __file__, "--child", backend, kind, str(runs), str(warmup)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(args, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{tree} {backend} {kind}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if Path(result["lantern"]).resolve() != (tree / "lantern").resolve():
        raise RuntimeError(f"the child imported {result['lantern']}, not {tree}/lantern")
    return result


def pg_answers() -> bool:
    try:
        import psycopg

        url = os.environ.get("LANTERN_BENCH_PG_URL", DEFAULT_PG_URL)
        with psycopg.connect(url, connect_timeout=3):
            return True
    except Exception:
        return False


def compare(
    ref: str, backends: list[str], runs: int, rounds: int, warmup: int, kinds: list[str]
) -> None:
    if "postgres" in backends and not pg_answers():
        print("postgres: not answering; skipped")
        backends = [b for b in backends if b != "postgres"]
    with tempfile.TemporaryDirectory() as tmp:
        before = extract(ref, Path(tmp))
        builds = {"before": before, "after": ROOT}
        rev = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", ref], capture_output=True, text=True
        ).stdout.strip()
        print(f"before: {ref} ({rev}); after: the working tree at {ROOT}")
        print(f"{rounds} rounds x {runs} sequential runs per build, backend and kind\n")
        got: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for r in range(rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for backend in backends:
                for kind in kinds:
                    for build in order:
                        result = measure(builds[build], backend, kind, runs, warmup)
                        got.setdefault((backend, kind, build), []).append(result)
            print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    calls = bool(os.environ.get("BENCH_CALLS"))
    if calls:  # Python function calls per step (cProfile on): a count load cannot disturb
        print("backend   kind    build    calls/step")
        for backend in backends:
            for kind in kinds:
                for build in ("before", "after"):
                    n = statistics.median(x["calls_per_step"] for x in got[(backend, kind, build)])
                    print(f"{backend:8}  {kind:6}  {build:6}  {n:10,.0f}")
        return
    print("backend   kind    build    µs/step   CPU µs/step   after/before (median of rounds)")
    for backend in backends:
        for kind in kinds:
            for build in ("before", "after"):
                rows = got[(backend, kind, build)]
                wall = statistics.median(x["us_per_step"] for x in rows)
                cpu = statistics.median(x["cpu_us_per_step"] for x in rows)
                ratio = ""
                if build == "after":
                    befores = got[(backend, kind, "before")]
                    w = _paired(befores, rows, "us_per_step")
                    c = _paired(befores, rows, "cpu_us_per_step")
                    ratio = f"wall {w:.3f}x  cpu {c:.3f}x"
                print(f"{backend:8}  {kind:6}  {build:6}  {wall:8,.0f}  {cpu:12,.0f}   {ratio}")


def _paired(befores: list[dict[str, Any]], afters: list[dict[str, Any]], field: str) -> float:
    """The median over rounds of after/before in the same round."""
    ratios: list[float] = [a[field] / b[field] for b, a in zip(befores, afters, strict=True)]
    return statistics.median(ratios)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        backend, kind, runs, warmup = argv[1], argv[2], int(argv[3]), int(argv[4])
        print(json.dumps(asyncio.run(child(backend, kind, runs, warmup))))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--compare", default="main", metavar="REF", help="the build before (git rev)")
    p.add_argument("--runs", type=int, default=40, help="timed sequential runs per child")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    p.add_argument("--warmup-runs", type=int, default=3)
    p.add_argument("--backends", default="sqlite,postgres")
    p.add_argument("--kinds", default=",".join(KINDS), help="some of graph, plain, code")
    a = p.parse_args(argv)
    kinds = [k for k in a.kinds.split(",") if k]
    if not kinds or set(kinds) - set(KINDS):
        p.error(f"--kinds: some of {', '.join(KINDS)}")
    compare(a.compare, a.backends.split(","), a.runs, a.rounds, a.warmup_runs, kinds)


if __name__ == "__main__":
    main()
