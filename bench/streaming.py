"""Streaming: commit -> SSE client latency, and what streaming a model step costs in CPU.

Latency: a real ``lantern serve`` (a subprocess) drives a run that parks at an approval and
then makes ``--steps`` no-op tool steps; ``K`` followers (1, then ``--followers``) in this
process each hold ``GET /v1/runs/{id}/stream`` open on their own connection. Once all are
connected and caught up, the run is approved, and each follower notes when each journal frame
arrives. The latency of a frame is its arrival time minus the event's ``at`` (taken when the
event is written, just before its commit, in milliseconds), so it includes the commit itself,
the notification, the journal read and the send. On PostgreSQL it is measured twice: with the
followers on the replica that drives the run, and on a second replica that hears of commits
only through LISTEN/NOTIFY.

CPU: one OpenAI-wire call answering ~500 tokens (500 words, one chunk each when streamed), from
the fake provider of tests/ on a thread of this process, made ``--calls`` times without
streaming and with streaming into Lantern's live-text buffer; the figure is the event loop
thread's CPU time per call (``time.thread_time``), which leaves out the fake server's threads.
The same for the offline provider.

    .venv/bin/python bench/streaming.py [--followers 200] [--steps 30] [--calls 30]
        [--backends sqlite,postgres]

``LANTERN_BENCH_PG_URL`` overrides the PostgreSQL URL (a fresh schema, dropped at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import secrets
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lantern.engine.live import LiveText
from lantern.models.offline import OfflineProvider
from lantern.models.openai import OpenAIProvider
from lantern.models.records import Message, ModelRequest
from tests.fake_llm import FakeProvider, Script
from tests.server import ALL_SCOPES, Server, make_key
from tests.sse import frames

PG_URL = os.environ.get("LANTERN_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def agent(steps: int) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [
        {"id": "start", "type": "trigger"},
        {"id": "ok", "type": "approval", "data": {"prompt": "Go?"}},
    ]
    edges = [{"source": "start", "target": "ok"}]
    for i in range(1, steps + 1):
        nodes.append({"id": f"s{i}", "type": "tool", "data": {"tool": "noop", "args": {"i": i}}})
        edges.append({"source": "ok" if i == 1 else f"s{i - 1}", "target": f"s{i}"})
    return {"name": "bench-stream", "graph": {"nodes": nodes, "edges": edges}}


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def latency(
    drive: Server, follow: Server, key: str, followers: int, steps: int
) -> tuple[list[float], str]:
    """The frames' latencies, and the worker id of the replica that drove the run on."""
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=followers + 10, max_keepalive_connections=followers + 10)
    async with (
        httpx.AsyncClient(base_url=drive.url, headers=headers, timeout=30) as control,
        httpx.AsyncClient(base_url=follow.url, headers=headers, timeout=30, limits=limits) as http,
    ):
        (await control.put("/v1/agents/bench-stream", json=agent(steps))).raise_for_status()
        created = await control.post("/v1/runs", json={"agentName": "bench-stream", "input": {}})
        run_id = created.json()["id"]
        parked = [asyncio.Event() for _ in range(followers)]
        samples: list[float] = []
        driver: list[str] = []

        async def one(i: int) -> None:
            async for frame in frames(http, run_id):
                arrived = time.time()
                if frame.event != "journal":
                    continue
                if frame.data["kind"] == "run_resumed" and i == 0:
                    driver.append(str(frame.data["data"].get("worker")))
                if parked[i].is_set():
                    at = datetime.fromisoformat(frame.data["at"]).timestamp()
                    samples.append((arrived - at) * 1000)
                elif frame.data["kind"] == "step_waiting":
                    parked[i].set()

        tasks = [asyncio.ensure_future(one(i)) for i in range(followers)]
        await asyncio.wait_for(asyncio.gather(*(p.wait() for p in parked)), 120)
        await asyncio.sleep(0.5)
        answer = await control.post(f"/v1/runs/{run_id}/approvals/ok", json={"decision": "approve"})
        answer.raise_for_status()
        await asyncio.wait_for(asyncio.gather(*tasks), 300)
        return samples, driver[0] if driver else "?"


def fresh_pg() -> tuple[str, str] | None:
    try:
        with psycopg.connect(PG_URL, autocommit=True, connect_timeout=3) as conn:
            schema = f"bench_{secrets.token_hex(4)}"
            conn.execute(f"CREATE SCHEMA {schema}")
    except psycopg.Error as exc:
        print(f"postgres: skipped ({exc})")
        return None
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options=-csearch_path%3D{schema}", schema


def report(label: str, samples: list[float]) -> None:
    print(
        f"  {label:<44} p50 {pct(samples, 50):7.1f} ms   p99 {pct(samples, 99):7.1f} ms"
        f"   ({len(samples)} frames)"
    )


async def latencies(args: argparse.Namespace) -> None:
    print("commit -> SSE client latency (event written -> frame received)")
    for backend in args.backends.split(","):
        schema = None
        with tempfile.TemporaryDirectory() as tmp:
            if backend == "sqlite":
                url = f"sqlite:///{tmp}/bench.db"
            else:
                made = fresh_pg()
                if made is None:
                    continue
                url, schema = made
            log = Path(tmp)
            # One key holds every follower: lift the per-key stream limit past them.
            wide = {"LANTERN_STREAMS_PER_KEY": str(args.followers + 8)}
            first = Server(url, log / "a.log", env={"LANTERN_WORKER_ID": "a", **wide})
            first.start(timeout=120)
            second = None
            try:
                key = await asyncio.to_thread(make_key, url, "bench", ALL_SCOPES)
                for k in (1, args.followers):
                    samples, _ = await latency(first, first, key, k, args.steps)
                    report(f"{backend}, {k} follower(s)", samples)
                if backend == "postgres":
                    # Followers on replica b while both replicas take runs: whichever resumes
                    # the run after the approval drives it, so each figure is labelled with
                    # where the followers were (b driving, or b hearing of a's commits only
                    # through LISTEN/NOTIFY).
                    second = Server(url, log / "b.log", env={"LANTERN_WORKER_ID": "b", **wide})
                    second.start(timeout=120)
                    for k in (1, args.followers):
                        samples, driver = await latency(first, second, key, k, args.steps)
                        where = "on the driving replica" if driver == "b" else "on another replica"
                        report(f"{backend}, {k} follower(s) {where}", samples)
            finally:
                first.stop()
                if second is not None:
                    second.stop()
                if schema is not None:
                    with psycopg.connect(PG_URL, autocommit=True) as conn:
                        conn.execute(f"DROP SCHEMA {schema} CASCADE")


async def cpu(args: argparse.Namespace) -> None:
    words = " ".join(f"w{i % 97}" for i in range(500))
    fake = FakeProvider(script=Script([words])).start()
    os.environ.update(fake.env())
    live = LiveText()
    provider = OpenAIProvider()
    offline = OfflineProvider(0.0)
    print(f"CPU of a ~500-token model step (event loop thread, {args.calls} calls each)")
    try:
        rows: dict[str, list[float]] = {}
        for round_ in range(args.calls):
            for label, streamed, p in (
                ("openai wire, not streamed", False, provider),
                ("openai wire, streamed", True, provider),
                ("offline, not streamed", False, offline),
                ("offline, streamed", True, offline),
            ):
                request = ModelRequest(
                    "gpt-4o-mini" if p is provider else "offline/echo",
                    (Message("user", words),),
                    f"k-{label}-{round_}",
                )
                sink = live.sink if streamed else None
                follower = live.follow("run", lambda: None) if streamed else None
                on_text = None if sink is None else sink("run", "step", round_ + 1)
                began = time.thread_time()
                answer = await p.complete(request, on_text)
                rows.setdefault(label, []).append(time.thread_time() - began)
                assert len(answer.text) == len(words), label
                if follower is not None:
                    follower.take()
                    follower.close()
        base = {"openai": statistics.median(rows["openai wire, not streamed"])}
        base["offline"] = statistics.median(rows["offline, not streamed"])
        for label, values in rows.items():
            med = statistics.median(values)
            ratio = med / base[label.split(" ")[0].rstrip(",")]
            print(f"  {label:<30} {med * 1000:8.2f} ms CPU per call   x{ratio:5.2f}")
    finally:
        await provider.aclose()
        fake.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--followers", type=int, default=200)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--only", choices=["latency", "cpu"], default=None)
    args = parser.parse_args()
    print(
        f"python {platform.python_version()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    )
    if args.only != "cpu":
        asyncio.run(latencies(args))
    if args.only != "latency":
        asyncio.run(cpu(args))


if __name__ == "__main__":
    main()
