"""What a claimed delivery costs over an unclaimed one.

Three agents of 10 steps each POST to a local receiver (a real HTTP server on 127.0.0.1):
``http`` uses the http connector (unclaimed: the Idempotency-Key and the CompletedStep gate
protect it), ``tool`` posts from a tool without a claim, and ``claimed`` posts from a tool
through ``ctx.deliver_once`` (a side_effect_receipts claim before, the outcome after). Runs
go one after another, interleaved in rounds, on SQLite and PostgreSQL; the figure is wall
time per step and the ratio claimed / unclaimed.

Target (the deliveries issue): a claimed delivery costs under 1.5x the unclaimed http step on
PostgreSQL.

    .venv/bin/python bench/deliveries.py [--runs 20] [--rounds 5] [--backends sqlite,postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import tempfile
import time
from typing import Any

import httpx
import psycopg

import lantern
from lantern.demo.receiver import Receiver
from lantern.effects.egress import EgressPolicy
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.store import Store, open_store

STEPS = 10
PG_URL = os.environ.get("LANTERN_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
TARGET = 1.5

app = lantern.App()
_client: dict[str, httpx.AsyncClient] = {}


def client() -> httpx.AsyncClient:
    if "c" not in _client:
        _client["c"] = httpx.AsyncClient(timeout=30)
    return _client["c"]


async def post(url: str, key: str) -> Any:
    response = await client().post(url, json={}, headers={"Idempotency-Key": key})
    response.raise_for_status()
    return response.json()


@app.tool("plain")
async def plain(ctx: lantern.ToolContext, url: str) -> Any:
    return await post(url, ctx.idempotency_key)


@app.tool("claimed")
async def claimed(ctx: lantern.ToolContext, url: str) -> Any:
    return await ctx.deliver_once("post", lambda: post(url, ctx.idempotency_key))


def chain(name: str, node: dict[str, Any]) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"}]
    edges = []
    previous = "start"
    for k in range(1, STEPS + 1):
        nodes.append({"id": f"s{k}", **node})
        edges.append({"source": previous, "target": f"s{k}"})
        previous = f"s{k}"
    return {"name": name, "graph": {"nodes": nodes, "edges": edges}}


def agents(url: str) -> dict[str, dict[str, Any]]:
    connector = {"connector": "http", "method": "POST", "url": f"{url}/http", "body": {}}
    return {
        "http": chain("http", {"type": "connector", "data": connector}),
        "tool": chain(
            "tool", {"type": "tool", "data": {"tool": "plain", "args": {"url": f"{url}/tool"}}}
        ),
        "claimed": chain(
            "claimed",
            {"type": "tool", "data": {"tool": "claimed", "args": {"url": f"{url}/claimed"}}},
        ),
    }


async def measure(store: Store, url: str, runs: int, rounds: int) -> dict[str, list[float]]:
    for definition in agents(url).values():
        await apply_agent(store, definition)
    per_step: dict[str, list[float]] = {name: [] for name in ("http", "tool", "claimed")}
    loopback = EgressPolicy.parse("127.0.0.1")  # the receiver is on loopback
    async with Worker(store, app, worker_id="bench", lease_ttl=600, egress=loopback) as worker:
        assert worker.runner is not None
        for name in per_step:  # warm-up
            await worker.runner.drive((await create_run(store, name, {})).id)
        for _ in range(rounds):
            for name, samples in per_step.items():
                ids = [(await create_run(store, name, {})).id for _ in range(runs)]
                began = time.perf_counter()
                for run_id in ids:
                    done = await worker.runner.drive(run_id)
                    assert done is not None and done.status == "succeeded", done
                samples.append((time.perf_counter() - began) / (runs * STEPS) * 1e6)
    return per_step


async def backend(name: str, url: str, receiver: Receiver, args: argparse.Namespace) -> None:
    store = open_store(url)
    await store.open()
    try:
        result = await measure(store, receiver.url, args.runs, args.rounds)
    finally:
        await store.close()
    base = statistics.median(result["http"])
    for kind, samples in result.items():
        med = statistics.median(samples)
        note = ""
        if kind == "claimed":
            verdict = "met" if med / base < TARGET else "MISSED"
            note = f"  < {TARGET}x the http step{' on PostgreSQL' if name == 'postgres' else ''}"
            note += f": {verdict}" if name == "postgres" else ""
        print(f"{name:<9} {kind:<8} {med:>9,.0f} {min(samples):>9,.0f} {med / base:>6.2f}x{note}")


async def main(args: argparse.Namespace) -> None:
    receiver = Receiver().start()
    print(f"{STEPS} steps per run, {args.runs} runs per sample, {args.rounds} interleaved rounds")
    print(f"{'backend':<9} {'step':<8} {'µs/step':>9} {'best':>9} {'ratio':>7}")
    try:
        if "sqlite" in args.backends:
            folder = tempfile.mkdtemp(prefix="lantern-bench-deliveries-")
            await backend("sqlite", f"sqlite:///{folder}/bench.db", receiver, args)
        if "postgres" in args.backends:
            schema = f"bench_{secrets.token_hex(4)}"
            try:
                admin = await psycopg.AsyncConnection.connect(PG_URL, autocommit=True)
            except psycopg.Error as exc:
                print(f"postgres: skipped, {PG_URL} does not answer ({exc})")
                return
            await admin.execute(f"CREATE SCHEMA {schema}")
            try:
                scoped = PG_URL + ("&" if "?" in PG_URL else "?")
                await backend(
                    "postgres", f"{scoped}options=-csearch_path%3D{schema}", receiver, args
                )
            finally:
                await admin.execute(f"DROP SCHEMA {schema} CASCADE")
                await admin.close()
    finally:
        receiver.close()
        if "c" in _client:
            await _client["c"].aclose()
    print("http: the http connector (unclaimed); tool: a tool posting without a claim;")
    print("claimed: a tool posting through ctx.deliver_once; ratio: over the http step.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backends", default="sqlite,postgres")
    asyncio.run(main(parser.parse_args()))
