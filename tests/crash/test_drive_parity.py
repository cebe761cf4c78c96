"""One drive discipline under every kind of run: the same work as a graph agent, a plain agent
and a code-first agent (a model turn, a tool that calls a peer over HTTP, a model turn) yields
the same observability facts, across a SIGKILL and a restart, as a real OTLP receiver, the peer, the
model provider and the replica's /metrics see them; and a step retried twice then a step in
flight at a SIGKILL yield the same journal facts in a graph, a code-first and a microVM run."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lantern.demo.receiver import Receiver
from lantern.engine.runs import apply_agent, create_run
from lantern.ids import idempotency_key
from lantern.observability.tracing import trace_id_for
from lantern.store import Store
from tests.crash.code_app import app as code_app
from tests.crash.processes import Serve
from tests.crash.test_sigkill import wait_for_status
from tests.fake_llm import Script
from tests.fake_llm import running as provider
from tests.otlp import OtlpReceiver, ReceivedSpan, running
from tests.runtime.cluster import Cluster
from tests.runtime.conftest import working
from tests.server import free_port

MODEL = "gpt-4o-mini"
# The run id is on the drive's span and the idempotency key derives from the run id, the step
# id and the attempt: a step's span repeats neither (docs/observability.md).
STEP_ATTRIBUTES = {"lantern.step_id", "lantern.node_type", "lantern.attempt", "lantern.replayed"}


def graph_agent(url: str) -> dict[str, Any]:
    """trigger -> first (model) -> ping (the tool) -> last (model)."""
    turn = {"model": MODEL, "prompt": "Say hi to {{ input.name }}"}
    return {
        "name": "shaped",
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "first", "type": "ai-step", "data": turn},
                {"id": "ping", "type": "tool", "data": {"tool": "ping", "args": {"url": url}}},
                {"id": "last", "type": "ai-step", "data": turn},
            ],
            "edges": [
                {"source": "start", "target": "first"},
                {"source": "first", "target": "ping"},
                {"source": "ping", "target": "last"},
            ],
        },
    }


@dataclass(frozen=True)
class Kind:
    """One kind of run: its agent, its script, its steps (first model turn, tool, last)."""

    name: str
    steps: tuple[str, str, str]
    model_type: str
    agent_name: str = "shaped"
    app: str = "tests.crash.crash_app:app"

    def agent(self, url: str) -> dict[str, Any] | None:
        if self.name == "graph":
            return graph_agent(url)
        if self.name == "code":
            return None  # tests.crash.code_app's ``shaped-code``: ctx.model, ctx.tool, ctx.model
        return {"name": "shaped", "model": MODEL, "tools": ["ping"]}

    def input(self, url: str) -> Any:
        return {"name": "Ada"} if self is GRAPH else {"url": url} if self is CODE else "Hi"

    def script(self, url: str) -> Script:
        if self.name == "plain":
            return Script([[("ping", {"url": url})], "Hello."])
        return Script(["Hello."])


GRAPH = Kind("graph", ("first", "ping", "last"), "ai-step")
PLAIN = Kind("plain", ("llm:1", "tool:1:ping", "llm:2"), "llm")
CODE = Kind("code", ("first", "ping", "last"), "llm", "shaped-code", "tests.crash.code_app:app")


def metric_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def traceparent(value: str) -> tuple[int, int]:
    _, trace_hex, span_hex, _ = value.split("-")
    return int(trace_hex, 16), int(span_hex, 16)


async def facts(
    kind: Kind, store: Store, tmp_path: Path, otlp: OtlpReceiver, receiver: Receiver
) -> dict[str, Any]:
    """Drive the work, killed after its tool's completion and finished by a second replica;
    what each observer saw, named by role (first, tool, last) rather than by step id."""
    _, tool_id, last_id = kind.steps
    roles = dict(zip(kind.steps, ("first", "tool", "last"), strict=True))
    peer = f"{receiver.url}/ping-{kind.name}"
    with provider(script=kind.script(peer)) as fake:
        definition = kind.agent(peer)
        if definition is not None:
            await apply_agent(store, definition)
        run = await create_run(store, kind.agent_name, kind.input(peer), app=code_app)
        env = {
            **fake.env(),
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            "LANTERN_LEASE_TTL": "5s",  # the killed replica's lease expires soon
            "LANTERN_RECOVERY_INTERVAL": "500ms",
            "LANTERN_TEST_PRELOAD_OPENAI": "1",
            "LANTERN_TEST_CRASH_RUN": run.id,
        }
        doomed = Serve(
            store.url,
            tmp_path / f"{kind.name}-a.log",
            kind.app,
            LANTERN_WORKER_ID=f"{kind.name}-a",
            LANTERN_TEST_CRASH_AFTER=f"step_completed:{tool_id}",
            **env,
        )
        code = await asyncio.to_thread(doomed.proc.wait, 60)
        doomed.out.close()
        assert code == -9, doomed.output()
        port = free_port()
        second = Serve(
            store.url,
            tmp_path / f"{kind.name}-b.log",
            kind.app,
            LANTERN_WORKER_ID=f"{kind.name}-b",
            LANTERN_PORT=str(port),
            **env,
        )
        try:
            await wait_for_status(store, run.id, "succeeded", timeout=60)
            async with httpx.AsyncClient() as http:
                scraped = metric_samples((await http.get(f"http://127.0.0.1:{port}/metrics")).text)
        finally:
            assert second.stop() == 0, second.output()  # a clean stop flushes the spans
        model_requests = fake.calls()

    trace_id = trace_id_for(run.id)
    spans = [s for s in otlp.received() if s.trace_id == trace_id]
    assert spans
    # The drive that finished the run (a drive cut short by a database failure would be
    # another, with an error status).
    resumed = [
        s
        for s in spans
        if s.name == f"run {kind.agent_name}"
        and s.attributes.get("lantern.run_status") == "succeeded"
    ]
    assert len(resumed) == 1 and resumed[0].resource["service.instance.id"] == f"{kind.name}-b"
    assert resumed[0].attributes["lantern.recovered"] is True
    assert resumed[0].attributes["lantern.run_id"] == run.id

    def steps_of(where: str) -> list[ReceivedSpan]:
        return [
            s
            for s in spans
            if s.name.startswith("step ")
            and s.resource["service.instance.id"] == f"{kind.name}-{where}"
            and s.attributes["lantern.step_id"] in roles
        ]

    for span in steps_of("a") + steps_of("b"):
        assert STEP_ATTRIBUTES <= span.attributes.keys(), span
        assert not {"lantern.run_id", "lantern.idempotency_key"} & span.attributes.keys()
        assert span.attributes["lantern.attempt"] == 1
    replayed = {
        roles[str(s.attributes["lantern.step_id"])]
        for s in steps_of("b")
        if s.attributes["lantern.replayed"] and s.start_ns == s.end_ns
    }
    [last] = [s for s in steps_of("b") if s.attributes["lantern.step_id"] == last_id]
    assert last.attributes["lantern.replayed"] is False
    assert last.parent_span_id == resumed[0].span_id
    assert last.attributes["lantern.node_type"] == kind.model_type

    # traceparent on every outgoing request, in the run's trace; the last model request's
    # parent is the last step's span.
    pings = [h for h in receiver.hits if h.path == f"/ping-{kind.name}"]
    assert len(pings) == 1 and pings[0].idempotency_key == idempotency_key(run.id, tool_id, 1)
    assert traceparent(pings[0].headers["traceparent"])[0] == trace_id
    # The first turn was served from the journal after the kill: one request per turn (a
    # request the SDK re-sent carries the same key and traceparent).
    by_key = {r.key: traceparent(r.headers["traceparent"]) for r in model_requests}
    assert by_key.keys() == {idempotency_key(run.id, s, 1) for s in (kind.steps[0], last_id)}
    assert {t for t, _ in by_key.values()} == {trace_id}
    assert by_key[idempotency_key(run.id, last_id, 1)][1] == last.span_id

    def sample(name: str, **labels: str) -> float:
        return scraped.get((name, tuple(sorted(labels.items()))), 0.0)

    kinds_counted = {
        dict(labels)["kind"]
        for (name, labels), value in scraped.items()
        if name == "lantern_journal_events_total" and value > 0
    }
    return {
        "replayed": replayed,
        "last span usage": {
            k: last.attributes.get(k)
            for k in ("lantern.usage.output_tokens", "gen_ai.request.model", "gen_ai.system")
        },
        "tokens": sample(
            "lantern_model_tokens_total", provider="openai", model=MODEL, direction="output"
        ),
        "cost > 0": sample("lantern_model_cost_usd_total", provider="openai", model=MODEL) > 0,
        "journal events counted": kinds_counted,
        "journal writes": sample("lantern_journal_write_seconds_count") > 0,
        "model steps timed": sample(
            "lantern_step_duration_seconds_count", node_type=kind.model_type
        ),
        "recoveries": sample("lantern_recoveries_total"),
    }


async def test_a_graph_a_plain_and_a_code_agent_yield_the_same_observability_facts(
    store: Store, tmp_path: Path, receiver: Receiver
) -> None:
    with running() as otlp:
        graph = await facts(GRAPH, store, tmp_path, otlp, receiver)
        plain = await facts(PLAIN, store, tmp_path, otlp, receiver)
        code = await facts(CODE, store, tmp_path, otlp, receiver)
    assert graph == plain
    assert code == graph
    assert graph["replayed"] == {"first", "tool"}
    assert graph["journal events counted"] == {"run_recovered", "step_completed", "run_succeeded"}
    assert graph["tokens"] > 0 and graph["cost > 0"] and graph["journal writes"]
    assert graph["last span usage"]["gen_ai.request.model"] == MODEL
    assert graph["recoveries"] == 1 and graph["model steps timed"] == 1


# -- the same journal facts: graph, code-first and microVM runs -----------------------------

FLAKY_GRAPH = {
    "name": "flaky-graph",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {
                "id": "flaky",
                "type": "tool",
                "data": {"tool": "flaky", "retry": {"maxAttempts": 3, "backoffMs": 100}},
            },
            {"id": "after", "type": "tool", "data": {"tool": "after"}},
        ],
        "edges": [{"source": "start", "target": "flaky"}, {"source": "flaky", "target": "after"}],
    },
}


def journal_facts(run_id: str, events: list[Any]) -> dict[str, Any]:
    """What the journal says of a step failing twice then succeeding and of a step in flight
    at a SIGKILL, whatever kind of run: the steps' events in order, each retry's decision and
    due time, the key the successful attempt ran under, and that nothing completed twice."""
    steps = [e for e in events if e.step_id in ("flaky", "after")]
    [output] = [
        e.data["output"] for e in steps if e.kind == "step_completed" and e.step_id == "flaky"
    ]

    def due_at_delay(e: Any) -> bool:
        at_ms = e.at.timestamp() * 1000
        return bool(abs(e.data["dueAt"] - e.data["delayMs"] - at_ms) < 1000)

    return {
        "steps": [(e.kind, e.step_id, e.attempt) for e in steps],
        "retries": [
            (e.data["attempt"], e.data["of"], e.data["error"]["class"], due_at_delay(e))
            for e in steps
            if e.kind == "step_retrying"
        ],
        "output": {
            "attempt": output["attempt"],
            "key": output["key"] == idempotency_key(run_id, "flaky", 3),
        },
    }


async def in_process_facts(store: Store, tmp_path: Path, agent: str, name: str) -> dict[str, Any]:
    """The run, its server SIGKILLed after the retried step completed, finished by another."""
    run = await create_run(store, agent, {}, app=code_app)
    env = {
        "LANTERN_LEASE_TTL": "5s",
        "LANTERN_RECOVERY_INTERVAL": "500ms",
        "LANTERN_TEST_CRASH_RUN": run.id,
    }
    app = "tests.crash.code_app:app"
    doomed = Serve(
        store.url, tmp_path / f"{name}-a.log", app, LANTERN_TEST_CRASH_AFTER="step_completed:flaky",
        LANTERN_WORKER_ID=f"{name}-a", **env,
    )  # fmt: skip
    code = await asyncio.to_thread(doomed.proc.wait, 60)
    doomed.out.close()
    assert code == -9, doomed.output()
    second = Serve(store.url, tmp_path / f"{name}-b.log", app, LANTERN_WORKER_ID=f"{name}-b", **env)
    try:
        await wait_for_status(store, run.id, "succeeded", timeout=60)
    finally:
        assert second.stop() == 0, second.output()
    events = await store.events(run.id, blobs=True)
    assert [e.kind for e in events].count("run_recovered") == 1
    return journal_facts(run.id, events)


async def microvm_facts(store: Store, tmp_path: Path) -> dict[str, Any]:
    """The run in a sandbox VM, its runtime node SIGKILLed while the second step runs; the
    run resumed in a VM on the other node."""
    working("sandbox")
    # Its key is made with asyncio.run, off this test's loop.
    cluster = await asyncio.to_thread(lambda: Cluster(store.url, tmp_path).serve())
    try:
        nodes = {n: cluster.node(n) for n in ("p1", "p2")}
        cluster.agent("flaky-vm", "jobs:flaky_parity")
        run_id = cluster.start_run("flaky-vm", {})

        def after_started() -> bool:
            """step after started"""
            return any(e["stepId"] == "after" for e in cluster.events(run_id))

        await asyncio.to_thread(cluster.wait_for, after_started, 60)
        [first] = cluster.vms(run_id)
        nodes[first["nodeId"]].signal(signal.SIGKILL)
        run = await asyncio.to_thread(cluster.finished, run_id, 90)
        assert run["status"] == "succeeded", run
        assert [vm["reason"] for vm in cluster.vms(run_id)] == ["node_lost", "exited"]
    finally:
        cluster.close()
    return journal_facts(run_id, await store.events(run_id, blobs=True))


@pytest.mark.timeout(300)  # three runs, each killed and recovered: five servers, a cluster
async def test_graph_code_first_and_microvm_runs_journal_the_same_step_facts(
    store: Store, tmp_path: Path
) -> None:
    """Kinds, retries with dueAt, keys, replays after a SIGKILL of the process that drives the
    run (the server for in-process runs, the runtime node for a VM). A plain agent has no step
    of the user's own to retry: its model turns' retries are the ledger's as the others'."""
    await apply_agent(store, FLAKY_GRAPH)
    graph = await in_process_facts(store, tmp_path, "flaky-graph", "graph")
    code = await in_process_facts(store, tmp_path, "flaky-code", "code")
    vm = await microvm_facts(store, tmp_path)
    assert graph == code == vm
    assert graph["steps"] == [
        ("step_started", "flaky", 1), ("step_retrying", "flaky", 2),
        ("step_started", "flaky", 2), ("step_retrying", "flaky", 3),
        ("step_started", "flaky", 3), ("step_completed", "flaky", 3),
        ("step_started", "after", 1), ("step_completed", "after", 1),
    ]  # fmt: skip
    assert graph["retries"] == [(2, 3, "tool", True), (3, 3, "tool", True)]
    assert graph["output"] == {"attempt": 3, "key": True}
