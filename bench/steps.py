"""Step throughput and per-step journal overhead, with committed INSERTs for scale.

Drives runs of 10 no-op tool steps (trigger -> t1 -> ... -> t10) in this process, one run
after another and ``--concurrency`` runs at a time, on SQLite and PostgreSQL, and prints
steps/s and the wall time per step. The tools do nothing, so every microsecond is Lantern's:
journal commits, lease round trips, the interpreter and the event loop.

For scale, the same program measures single-row committed INSERTs into a scratch table of
the same database with the same settings (SQLite: the store's own connection setup, one
``BEGIN IMMEDIATE``/``INSERT``/``COMMIT`` per row on a dedicated thread, as the store runs its
transactions; PostgreSQL: one autocommit ``INSERT`` per statement on a psycopg
``AsyncConnection``). Insert batches, sequential runs and concurrent runs are interleaved in
``--rounds`` rounds (INSERTs on both sides of each batch of sequential runs) so that drift on a
shared machine hits every figure alike.

Targets (from the issue): the sequential per-step overhead is at most 2x one committed INSERT,
and at 32 concurrent runs on PostgreSQL Lantern makes at least 1,500 steps/s.

The same rounds also drive a code-first agent (docs/code-agents.md) doing the same work: a function
making the 10 no-op steps as ``await ctx.step(...)`` calls, sequentially and ``--concurrency``
runs at a time, interleaved with the graph runs so the two paths are compared within one run
(which of the two goes first alternates round by round). Its figure is the median over rounds
of code µs/step / graph µs/step in the same round, with the lowest and highest round's.
Target (issue 15): a code-first step costs no more than a graph step.

Runs are created before each timed section (not timed); a timed run includes its lease
acquire and release, the journal read of the drive, the opening commit and one commit per step.

    .venv/bin/python bench/steps.py [--runs 200] [--concurrency 32] [--backends sqlite,postgres]

``--observability`` measures instead what the hash-chained journal and tracing cost per step:
sequential runs in four modes interleaved round by round (plain: no hashing, no tracing; hash:
today's default; trace; hash+trace), so one run prints µs/step of each and its ratio to plain.
Hashing is switched off by replacing the journal's canonical-JSON and SHA-256 functions in this
process only; tracing on is an SDK tracer provider with ``lantern serve``'s resource and a
BatchSpanProcessor whose exporter encodes each batch as the OTLP/HTTP exporter does (the
maintained library's protobuf encoding) and drops the bytes, so the network is not measured but
the spans, their attributes, the batch thread and the encoding are. A fifth mode,
hash+sampled, traces whole runs at a trace-id ratio of 0.1 (OTEL_TRACES_SAMPLER=traceidratio).
It also times the hash chain alone over one step's two events, and tracing's hooks alone.
Target (issue 8): hash chaining and tracing together add under 10% per step.

``--compare REF`` measures instead the build at git revision REF against the working tree,
interleaved round by round: per-step µs and this process's CPU µs per step, graph and plain
agents, both backends (see bench/drive_compare.py).

``LANTERN_BENCH_PG_URL`` overrides the PostgreSQL URL; PostgreSQL is skipped with a note when
it does not answer. SQLite lives in a temporary directory and PostgreSQL in a fresh schema
that is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol
from unittest import mock

import psycopg
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from psycopg.conninfo import conninfo_to_dict

import lantern
from lantern.engine import chain, journal
from lantern.engine.drive import observed
from lantern.engine.runner import Runner
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.observability import tracing
from lantern.observability.otlp import encode
from lantern.store.base import Store
from lantern.store.postgres import PostgresStore
from lantern.store.sqlite import SQLiteStore

STEPS_PER_RUN = 10
AGENT = "bench-noop-chain"
CODE_AGENT = "bench-noop-code"
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
OVERHEAD_TARGET = 2.0  # per-step overhead / one committed INSERT, sequential
OBSERVABILITY_TARGET = 1.10  # hash+trace per step / plain per step, sequential
PG_CONCURRENT_TARGET = 1500.0  # steps/s at 32 concurrent runs on PostgreSQL
# About the size of one journal event's data, so the baseline writes a comparable row.
PAYLOAD = json.dumps({"kind": "step_completed", "step": "t1", "output": None, "pad": "x" * 48})


# -- the workload -------------------------------------------------------------------------


def noop_chain(name: str, steps: int) -> dict[str, Any]:
    """trigger -> t1 -> ... -> tN, each a tool node calling the no-op tool."""
    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"}]
    edges: list[dict[str, str]] = []
    previous = "start"
    for k in range(1, steps + 1):
        nodes.append({"id": f"t{k}", "type": "tool", "data": {"tool": "noop", "args": {}}})
        edges.append({"source": previous, "target": f"t{k}"})
        previous = f"t{k}"
    return {"name": name, "graph": {"nodes": nodes, "edges": edges}}


class NoopTool:
    """The registered tool: does nothing but count its calls, to check the step count."""

    def __init__(self) -> None:
        self.calls = 0
        self.app = lantern.App()
        self.app.tool("noop")(self.noop)
        noop = self.noop

        @self.app.agent(CODE_AGENT)
        async def code_chain(ctx: lantern.Context, i: int) -> None:
            for k in range(1, STEPS_PER_RUN + 1):
                await ctx.step(f"t{k}", noop)

    async def noop(self) -> None:
        self.calls += 1


async def create_runs(
    store: Store, count: int, concurrency: int, agent: str = AGENT, app: lantern.App | None = None
) -> list[str]:
    """Queued runs of the bench agent (creation is not part of any timed figure)."""
    ids: list[str] = []
    while len(ids) < count:
        batch = min(concurrency, count - len(ids))
        runs = await asyncio.gather(
            *(create_run(store, agent, {"i": len(ids) + i}, app=app) for i in range(batch))
        )
        ids.extend(r.id for r in runs)
    return ids


async def drive_one(runner: Runner, run_id: str) -> None:
    run = await runner.drive(run_id)
    if run is None or run.status != "succeeded":
        status = None if run is None else (run.status, run.error)
        raise RuntimeError(f"run {run_id} did not succeed: {status}")


async def drive_sequential(runner: Runner, run_ids: Sequence[str]) -> None:
    for run_id in run_ids:
        await drive_one(runner, run_id)


async def drive_concurrent(runner: Runner, run_ids: Sequence[str], concurrency: int) -> None:
    """Keep ``concurrency`` runs in flight until every run is done."""
    queue = list(reversed(run_ids))

    async def lane() -> None:
        while queue:
            await drive_one(runner, queue.pop())

    await asyncio.gather(*(lane() for _ in range(min(concurrency, len(run_ids)))))


# -- the baseline: one committed single-row INSERT at a time ------------------------------


class Inserter(Protocol):
    async def insert(self) -> None: ...

    async def close(self) -> None: ...


class SQLiteInserter:
    """Same file, same connection setup as the store, one transaction per row on a thread."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="bench-sqlite")
        self._conn: sqlite3.Connection | None = None

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        # The store's own _connect, so the pragmas (WAL, synchronous=FULL, ...) are the same.
        self._conn = await loop.run_in_executor(self._pool, self._store._connect)
        await loop.run_in_executor(
            self._pool,
            self._conn.execute,
            "CREATE TABLE IF NOT EXISTS bench_inserts"
            " (id INTEGER PRIMARY KEY, at REAL NOT NULL, payload TEXT NOT NULL)",
        )

    def _tx(self) -> None:
        conn = self._conn
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO bench_inserts (at, payload) VALUES (?, ?)", (time.time(), PAYLOAD)
        )
        conn.execute("COMMIT")

    async def insert(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self._tx)

    async def close(self) -> None:
        if self._conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._pool, self._conn.close)
        self._pool.shutdown(wait=True)


class PostgresInserter:
    """Same URL (so same schema and server settings) as the store, autocommit, one row each."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def open(self) -> None:
        self._conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True)
        await self._conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_inserts (id bigint GENERATED ALWAYS AS IDENTITY"
            " PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(), payload text NOT NULL)"
        )

    async def insert(self) -> None:
        assert self._conn is not None
        await self._conn.execute("INSERT INTO bench_inserts (payload) VALUES (%s)", (PAYLOAD,))

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()


async def insert_many(inserter: Inserter, count: int) -> None:
    for _ in range(count):
        await inserter.insert()


# -- measuring ----------------------------------------------------------------------------


@dataclass
class Tally:
    """Operations and seconds, summed over rounds."""

    ops: int = 0
    seconds: float = 0.0
    rounds: dict[int, tuple[int, float]] = field(default_factory=dict)  # round -> ops, seconds
    transactions: int = 0  # journal transactions, when counted
    appends: int = 0  # journal appends they carried

    async def time(
        self,
        round_no: int,
        ops: int,
        work: Awaitable[None],
        counter: CommitCounter | None = None,
    ) -> None:
        gc.collect()
        before = (0, 0) if counter is None else counter.snapshot()
        started = time.perf_counter()
        await work
        elapsed = time.perf_counter() - started
        if counter is not None:
            after = counter.snapshot()
            self.transactions += after[0] - before[0]
            self.appends += after[1] - before[1]
        self.ops += ops
        self.seconds += elapsed
        done, spent = self.rounds.get(round_no, (0, 0.0))
        self.rounds[round_no] = (done + ops, spent + elapsed)

    @property
    def per_round(self) -> list[float]:
        """µs per operation in each round, in round order."""
        return [spent / done * 1e6 for done, spent in self.rounds.values() if done]

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds else float("nan")

    @property
    def micros(self) -> float:
        return self.seconds / self.ops * 1e6 if self.ops else float("nan")

    @property
    def appends_per_transaction(self) -> float | None:
        return self.appends / self.transactions if self.transactions else None


class CommitCounter:
    """Counts journal transactions and the appends they carry (group commit's batch size).

    Wraps the store's group committer when it has the expected shape; a diagnostic only.
    """

    def __init__(self, store: Store) -> None:
        self.transactions = 0
        self.appends = 0
        committer = getattr(store, "_commits", None)
        inner: Callable[[Sequence[Any]], Awaitable[Any]] | None = getattr(
            committer, "_write_batch", None
        )
        if committer is None or inner is None:
            return
        write = inner

        async def counted(batch: Sequence[Any]) -> Any:
            self.transactions += 1
            self.appends += len(batch)
            return await write(batch)

        committer._write_batch = counted

    def snapshot(self) -> tuple[int, int]:
        return self.transactions, self.appends


@dataclass
class Row:
    backend: str
    mode: str
    runs: int
    steps: Tally
    inserts: Tally
    target: str


@dataclass
class Sizes:
    runs: int
    concurrent_runs: int
    concurrency: int
    inserts: int
    rounds: int
    warmup_runs: int


def split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


async def bench_backend(
    backend: str, store: Store, open_inserter: Callable[[], Awaitable[Inserter]], sizes: Sizes
) -> list[Row]:
    await store.open()
    inserter: Inserter | None = None
    try:
        await apply_agent(store, noop_chain(AGENT, STEPS_PER_RUN))
        inserter = await open_inserter()
        counter = CommitCounter(store)
        seq, conc, ins = Tally(), Tally(), Tally()
        code_seq, code_conc = Tally(), Tally()
        tool = NoopTool()

        async def code_runs(count: int) -> list[str]:
            return await create_runs(store, count, sizes.concurrency, CODE_AGENT, tool.app)

        async with Worker(store, tool.app, worker_id=f"bench-{backend}", lease_ttl=600) as w:
            runner = w.runner
            assert runner is not None
            # Warm-up: connections, prepared statements, caches, the agent's parsed graph.
            await insert_many(inserter, 50)
            await drive_sequential(runner, await create_runs(store, sizes.warmup_runs, 1))
            warm = await create_runs(store, sizes.concurrency, sizes.concurrency)
            await drive_concurrent(runner, warm, sizes.concurrency)
            await drive_sequential(runner, await code_runs(sizes.warmup_runs))
            await drive_concurrent(runner, await code_runs(sizes.concurrency), sizes.concurrency)
            tool.calls = 0

            for k, (n_ins, n_seq, n_conc) in enumerate(
                zip(
                    split(sizes.inserts, sizes.rounds),
                    split(sizes.runs, sizes.rounds),
                    split(sizes.concurrent_runs, sizes.rounds),
                    strict=True,
                )
            ):
                # INSERTs on both sides of the sequential runs they are compared with.
                first, second = n_ins // 2, n_ins - n_ins // 2
                # The same work as code-first runs, beside the graph runs of this round; which
                # path goes first alternates round by round (A / B, then B / A).
                order = [(AGENT, seq, n_seq, 1), (CODE_AGENT, code_seq, n_seq, 1)]
                order += [
                    (AGENT, conc, n_conc, sizes.concurrency),
                    (CODE_AGENT, code_conc, n_conc, sizes.concurrency),
                ]
                if k % 2:
                    order = [order[1], order[0], order[3], order[2]]
                for agent, tally, n, lanes in order:
                    app = tool.app if agent == CODE_AGENT else None
                    ids = await create_runs(store, n, sizes.concurrency, agent, app)
                    work = (
                        drive_sequential(runner, ids)
                        if lanes == 1
                        else drive_concurrent(runner, ids, sizes.concurrency)
                    )
                    if tally is seq:
                        await ins.time(k, first, insert_many(inserter, first))
                    await tally.time(k, n * STEPS_PER_RUN, work, counter)
                    if tally is seq:
                        await ins.time(k, second, insert_many(inserter, second))
        total = seq.ops + conc.ops + code_seq.ops + code_conc.ops
        if tool.calls != total:
            raise RuntimeError(f"{tool.calls} tool calls for {total} steps")
    finally:
        if inserter is not None:
            await inserter.close()
        await store.close()

    ratio = seq.micros / ins.micros
    seq_target = f"<= {OVERHEAD_TARGET:g}x insert: " + (
        "met" if ratio <= OVERHEAD_TARGET else "MISSED"
    )
    if backend == "postgres" and sizes.concurrency == 32:
        met = conc.rate >= PG_CONCURRENT_TARGET
        conc_target = f">= {PG_CONCURRENT_TARGET:,.0f} steps/s: " + ("met" if met else "MISSED")
    else:
        conc_target = "-"

    def against_graph(code: Tally, graph: Tally) -> str:
        # The median of the rounds' paired ratios: a burst of load on the shared machine
        # lands in one round's pair rather than tilting the totals.
        paired = [c / g for c, g in zip(code.per_round, graph.per_round, strict=True)]
        ratio = statistics.median(paired)
        return f"{ratio:.2f}x graph (rounds {min(paired):.2f}-{max(paired):.2f}): " + (
            "met" if ratio <= 1.0 else "MISSED"
        )

    return [
        Row(backend, "sequential", sizes.runs, seq, ins, seq_target),
        Row(
            backend,
            f"{sizes.concurrency} at a time",
            sizes.concurrent_runs,
            conc,
            ins,
            conc_target,
        ),
        Row(backend, "code sequential", sizes.runs, code_seq, ins, against_graph(code_seq, seq)),
        Row(
            backend,
            f"code {sizes.concurrency} at a time",
            sizes.concurrent_runs,
            code_conc,
            ins,
            against_graph(code_conc, conc),
        ),
    ]


# -- observability: the hash chain and tracing, on and off --------------------------------

# "sampled": hashing and tracing with OTEL_TRACES_SAMPLER=traceidratio at 0.1 (whole runs)
MODES = ("plain", "hash", "trace", "hash+trace", "hash+sampled")
SAMPLED_RATIO = 0.1
NO_HASH = "f" * 64


def otlp_bytes(spans: Sequence[ReadableSpan]) -> bytes:
    """The request ``lantern serve`` exports: its own encoding, else the library's."""
    found = encode(spans)
    if found is None:
        library: bytes = encode_spans(spans).SerializePartialToString()
        return library
    return found


class DropSpans(SpanExporter):
    """Counts the spans it is handed, encodes them as ``lantern serve``'s exporter does, and
    drops the bytes: the network is not what is measured."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        otlp_bytes(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


@contextmanager
def observability(
    mode: str, provider: TracerProvider, sampled: TracerProvider | None = None
) -> Iterator[None]:
    """Hashing and tracing as ``mode`` says, in this process, for the ``with`` block."""
    with ExitStack() as unhashed:
        if "hash" not in mode:  # the journal's own names for them: what its EventWriter calls
            unhashed.enter_context(mock.patch.object(journal, "canonical", lambda *a, **k: b""))
            unhashed.enter_context(mock.patch.object(journal, "link", lambda prev, body: NO_HASH))
        tracing.install(provider if "trace" in mode else sampled if "sampled" in mode else None)
        try:
            yield
        finally:
            tracing.install(None)


def chain_micros(iterations: int = 10_000, repeats: int = 5) -> float:
    """µs of hashing for one no-op step's two events (its completion, the next one's start);
    the least of ``repeats`` timings, the one a busy machine disturbed least."""
    return min(_chain_once(iterations) for _ in range(repeats))


def _chain_once(iterations: int) -> float:
    at = datetime.now(UTC)
    previous = chain.GENESIS
    started = time.perf_counter()
    for seq in range(iterations):
        body = chain.canonical(
            "run_0123456789abcdef01234567",
            2 * seq,
            "step_completed",
            "t1",
            "t1",
            1,
            at,
            {"output": None},
        )
        previous = chain.link(previous, body)
        body = chain.canonical(
            "run_0123456789abcdef01234567",
            2 * seq + 1,
            "step_started",
            "t2",
            "t2",
            1,
            at,
            {"type": "tool"},
        )
        previous = chain.link(previous, body)
    return (time.perf_counter() - started) / iterations * 1e6


async def tracing_micros(runs: int = 1_000, repeats: int = 5) -> float:
    """CPU µs per step (this process, every thread) that tracing adds to the engine's per-step
    hook alone: a drive span per ``STEPS_PER_RUN`` step spans, through a BatchSpanProcessor,
    flushed at the end so that their OTLP encoding counts; least of ``repeats``."""
    exporter = DropSpans()
    provider = TracerProvider(resource=tracing.resource("bench"))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    run: Any = SimpleNamespace(
        id="run_0123456789abcdef01234567", agent_name=AGENT, agent_version=1, workspace="bench"
    )

    async def execute() -> None:
        return None

    async def once(on: bool) -> float:
        tracing.install(provider if on else None)
        started = time.process_time()
        for _ in range(runs):
            with tracing.drive(run, "bench"):
                for _ in range(STEPS_PER_RUN):
                    await observed(execute(), "t1", "tool", 1)
                tracing.drive_ended(None)
        provider.force_flush()
        tracing.install(None)
        return (time.process_time() - started) / (runs * STEPS_PER_RUN) * 1e6

    try:
        off = min([await once(False) for _ in range(repeats)])
        on = min([await once(True) for _ in range(repeats)])
    finally:
        provider.shutdown()
    return on - off


@dataclass
class ObservabilityRow:
    backend: str
    tallies: dict[str, Tally]  # wall time
    cpu: dict[str, Tally]  # this process's CPU time, every thread
    spans: int


async def bench_observability(backend: str, store: Store, sizes: Sizes) -> ObservabilityRow:
    await store.open()
    exporter = DropSpans()
    provider = TracerProvider(resource=tracing.resource(f"bench-{backend}"))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    sampled = TracerProvider(
        resource=tracing.resource(f"bench-{backend}"), sampler=TraceIdRatioBased(SAMPLED_RATIO)
    )
    sampled.add_span_processor(BatchSpanProcessor(DropSpans()))
    tallies = {mode: Tally() for mode in MODES}
    cpu = {mode: Tally() for mode in MODES}
    try:
        await apply_agent(store, noop_chain(AGENT, STEPS_PER_RUN))
        tool = NoopTool()
        async with Worker(store, tool.app, worker_id=f"bench-{backend}", lease_ttl=600) as w:
            runner = w.runner
            assert runner is not None
            for mode in MODES:  # warm-up, every mode's code path included
                with observability(mode, provider, sampled):
                    await drive_sequential(runner, await create_runs(store, sizes.warmup_runs, 1))
            for k, n in enumerate(split(sizes.runs, sizes.rounds)):
                # A different mode goes first in each round, so drift hits every mode alike.
                order = MODES[k % len(MODES) :] + MODES[: k % len(MODES)]
                for mode in order:
                    ids = await create_runs(store, n, sizes.concurrency)
                    with observability(mode, provider, sampled):
                        before = time.process_time()
                        await tallies[mode].time(
                            k, n * STEPS_PER_RUN, drive_sequential(runner, ids)
                        )
                        spent = time.process_time() - before
                    c = cpu[mode]
                    c.ops += n * STEPS_PER_RUN
                    c.seconds += spent
                    c.rounds[k] = (n * STEPS_PER_RUN, spent)
    finally:
        provider.shutdown()  # exports (drops) what is still batched
        sampled.shutdown()
        await store.close()
    return ObservabilityRow(backend, tallies, cpu, exporter.spans)


def print_observability(
    rows: Sequence[ObservabilityRow], chain_us: float, tracing_us: float
) -> None:
    def paired(t: Tally, base: Tally) -> float:
        """The median over rounds of this mode's µs/step over plain's in the same round."""
        return statistics.median(a / b for a, b in zip(t.per_round, base.per_round, strict=True))

    print()
    print("              |            wall time             |             CPU time")
    print("backend   mode           µs/step   vs plain   median      µs/step   vs plain   median")
    print("-" * 86)
    for row in rows:
        plain, plain_cpu = row.tallies["plain"], row.cpu["plain"]
        for mode in MODES:
            t, c = row.tallies[mode], row.cpu[mode]
            target = ""
            if mode == "hash+trace":
                met = paired(t, plain) < OBSERVABILITY_TARGET
                target = f"  target < {OBSERVABILITY_TARGET:.2f}: " + ("met" if met else "MISSED")
            print(
                f"{row.backend:8}  {mode:12}  {t.micros:8,.0f}  {t.micros / plain.micros:8.3f}x"
                f"  {paired(t, plain):6.3f}x"
                f"  {c.micros:10,.0f}  {c.micros / plain_cpu.micros:8.3f}x"
                f"  {paired(c, plain_cpu):6.3f}x{target}"
            )
        print(f"{row.backend:8}  spans encoded (and dropped) while tracing: {row.spans:,}")
    print()
    print("µs/step: per step of sequential runs over all rounds; vs plain: its ratio to plain's;")
    print("median: the median over rounds of the ratio to plain in the same round (robust to a")
    print("burst of load in one round; the target is judged on it). CPU: this process's CPU time,")
    print("every thread (the span batch thread too).")
    print()
    print(f"hash chain alone: {chain_us:.1f} µs per step (canonical JSON + SHA-256 of its two")
    print("events: its step_completed and the next step's step_started)")
    print(f"tracing alone:    {tracing_us:.1f} µs of CPU per step (its span, a tenth of a drive")
    print("span, a BatchSpanProcessor, the OTLP encoding; the least disturbed of 5 timings, as")
    print("for the hash chain)")
    for row in rows:
        plain_us = row.tallies["plain"].micros
        added = chain_us + tracing_us
        print(
            f"{row.backend}: the two add {added:.1f} µs to plain's {plain_us:,.0f} µs/step wall"
            f" = {added / plain_us:.1%} (target < {OBSERVABILITY_TARGET - 1:.0%})"
        )


async def observability_main(sizes: Sizes, backends: Sequence[str]) -> list[ObservabilityRow]:
    rows: list[ObservabilityRow] = []
    for backend in backends:
        if backend == "sqlite":
            with tempfile.TemporaryDirectory(prefix="lantern-bench-") as tmp:
                store: Store = SQLiteStore(f"sqlite:///{Path(tmp) / 'bench.db'}")
                rows.append(await bench_observability("sqlite", store, sizes))
        else:
            url = os.environ.get("LANTERN_BENCH_PG_URL", DEFAULT_PG_URL)
            try:
                admin = await psycopg.AsyncConnection.connect(url, autocommit=True)
            except psycopg.Error as exc:
                print(f"postgres: skipped, {describe_pg(url)} did not answer: {exc}")
                continue
            schema = f"bench_{secrets.token_hex(4)}"
            try:
                await admin.execute(f"CREATE SCHEMA {schema}")
                store = PostgresStore(with_search_path(url, schema))
                rows.append(await bench_observability("postgres", store, sizes))
            finally:
                await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
                await admin.close()
    return rows


# -- backends -----------------------------------------------------------------------------


async def run_sqlite(sizes: Sizes) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="lantern-bench-") as tmp:
        path = Path(tmp) / "bench.db"
        store = SQLiteStore(f"sqlite:///{path}")
        print(f"sqlite:   {sqlite3.sqlite_version}, {path} (WAL, synchronous=FULL)")

        async def open_inserter() -> Inserter:
            inserter = SQLiteInserter(store)
            await inserter.open()
            return inserter

        return await bench_backend("sqlite", store, open_inserter, sizes)


def with_search_path(url: str, schema: str) -> str:
    return url + ("&" if "?" in url else "?") + f"options=-csearch_path%3D{schema}"


def describe_pg(url: str) -> str:
    info = conninfo_to_dict(url)
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


async def run_postgres(sizes: Sizes) -> list[Row]:
    url = os.environ.get("LANTERN_BENCH_PG_URL", DEFAULT_PG_URL)
    try:
        admin = await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split())
        print(f"postgres: skipped, {describe_pg(url)} did not answer: {reason}")
        return []
    schema = f"bench_{secrets.token_hex(4)}"
    try:
        cur = await admin.execute(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit'),"
            " current_setting('fsync'), current_setting('wal_sync_method')"
        )
        row = await cur.fetchone()
        assert row is not None
        print(
            f"postgres: {row[0]} at {describe_pg(url)}, schema {schema}"
            f" (synchronous_commit={row[1]}, fsync={row[2]}, wal_sync_method={row[3]})"
        )
        await admin.execute(f"CREATE SCHEMA {schema}")
        scoped = with_search_path(url, schema)
        store = PostgresStore(scoped)

        async def open_inserter() -> Inserter:
            inserter = PostgresInserter(scoped)
            await inserter.open()
            return inserter

        return await bench_backend("postgres", store, open_inserter, sizes)
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()


# -- output -------------------------------------------------------------------------------

HEADERS = (
    "backend",
    "mode",
    "runs",
    "steps/s",
    "µs/step",
    "inserts/s",
    "µs/insert",
    "ratio",
    "appends/txn",
    "target",
)


def spread(values: Sequence[float], fmt: str) -> str:
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{format(low, fmt)} / {format(mid, fmt)} / {format(high, fmt)}"


def print_table(rows: Sequence[Row]) -> None:
    cells = [
        (
            r.backend,
            r.mode,
            str(r.runs),
            f"{r.steps.rate:,.0f}",
            f"{r.steps.micros:,.0f}",
            f"{r.inserts.rate:,.0f}",
            f"{r.inserts.micros:,.0f}",
            f"{r.steps.micros / r.inserts.micros:.2f}x",
            "-"
            if r.steps.appends_per_transaction is None
            else f"{r.steps.appends_per_transaction:.1f}",
            r.target,
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(HEADERS)]
    right = {2, 3, 4, 5, 6, 7, 8}

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if i in right else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ).rstrip()

    print()
    print(line(HEADERS))
    print(line(["-" * w for w in widths]))
    for c in cells:
        print(line(c))
    print()
    print("µs/step: wall time / tool steps; sequential, it is the per-step overhead (the tools")
    print("do nothing); concurrent, it is amortised. ratio: µs/step / µs/insert over all rounds.")
    print("appends/txn: journal appends per journal transaction (group commit).")
    print()
    print("Per round, min / median / max (rounds are interleaved, so a ratio pairs neighbours):")
    for r in rows:
        ratios = [a / b for a, b in zip(r.steps.per_round, r.inserts.per_round, strict=True)]
        print(
            f"  {r.backend:8} {r.mode:18}  µs/step {spread(r.steps.per_round, ',.0f'):>17}"
            f"  µs/insert {spread(r.inserts.per_round, ',.0f'):>15}"
            f"  ratio {spread(ratios, '.2f')}"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=200, help="sequential runs (default 200)")
    p.add_argument(
        "--concurrent-runs",
        type=int,
        default=None,
        help="runs driven in the concurrent mode (default 20 x --concurrency)",
    )
    p.add_argument("--concurrency", type=int, default=32, help="runs in flight (default 32)")
    p.add_argument(
        "--inserts", type=int, default=2000, help="baseline single-row INSERTs (default 2000)"
    )
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default 10)")
    p.add_argument("--warmup-runs", type=int, default=5, help="sequential warm-up runs")
    p.add_argument(
        "--observability",
        action="store_true",
        help="measure the hash chain and tracing: --runs sequential runs per mode, interleaved",
    )
    p.add_argument(
        "--backends",
        default="sqlite,postgres",
        help="comma-separated: sqlite, postgres (default both)",
    )
    args = p.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - {"sqlite", "postgres"}
    if unknown or not backends:
        p.error(f"--backends: unknown {', '.join(sorted(unknown)) or '(none given)'}")
    args.backends = backends
    if args.concurrent_runs is None:
        args.concurrent_runs = 20 * args.concurrency
    for name in ("runs", "concurrent_runs", "concurrency", "inserts", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if min(args.runs, args.concurrent_runs) < args.rounds or args.inserts < 2 * args.rounds:
        p.error("--runs and --concurrent-runs need at least --rounds, --inserts twice that")
    return args


async def main_async(args: argparse.Namespace) -> int:
    sizes = Sizes(
        runs=args.runs,
        concurrent_runs=args.concurrent_runs,
        concurrency=args.concurrency,
        inserts=args.inserts,
        rounds=args.rounds,
        warmup_runs=args.warmup_runs,
    )
    print(
        f"lantern {lantern.__version__}, Python {platform.python_version()},"
        f" {os.cpu_count()} CPUs; {STEPS_PER_RUN} no-op tool steps per run;"
        f" {sizes.runs} sequential runs, {sizes.concurrent_runs} runs {sizes.concurrency} at a"
        f" time, {sizes.inserts} INSERTs, in {sizes.rounds} interleaved rounds"
    )
    if args.observability:
        started = time.perf_counter()
        print("hash chain and tracing: sequential runs per mode, interleaved by round")
        rows_o = await observability_main(sizes, args.backends)
        print_observability(rows_o, chain_micros(), await tracing_micros())
        print(f"\ntotal {time.perf_counter() - started:.1f}s")
        return 0
    runners = {"sqlite": run_sqlite, "postgres": run_postgres}
    rows: list[Row] = []
    started = time.perf_counter()
    for backend in args.backends:
        rows += await runners[backend](sizes)
    if rows:
        print_table(rows)
    print(f"\ntotal {time.perf_counter() - started:.1f}s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--compare" in args:  # before/after of two builds: bench/drive_compare.py
        import drive_compare

        drive_compare.main(args)
        return 0
    return asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
