"""Traces of runs driven in-process, caught by the SDK's in-memory exporter, on both backends."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.trace import StatusCode

import lantern
from lantern import config
from lantern.demo.receiver import Receiver
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.observability import tracing
from lantern.store import Store
from lantern.store.records import Run
from tests.helpers import http_chain
from tests.integration.test_runner import graph, tool


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    yield exporter
    tracing.shutdown()


def by_name(spans: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in spans.get_finished_spans():
        found.setdefault(span.name, []).append(span)
    return found


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def run_of(span: ReadableSpan, runs: Sequence[Run]) -> str:
    """The run whose trace ``span`` is in (its trace id derives from the run id)."""
    assert span.context is not None
    [run_id] = [r.id for r in runs if tracing.trace_id_for(r.id) == span.context.trace_id]
    return run_id


def make_app(gate: asyncio.Event | None = None) -> lantern.App:
    app = lantern.App()

    @app.tool("echo")
    async def echo(**kwargs: Any) -> dict[str, Any]:
        return kwargs

    @app.tool("wait")
    async def wait() -> str:
        if gate is not None:
            gate.set()
            await asyncio.Event().wait()  # stays in flight until the drive is cut short
        return "done"

    @app.tool("model")
    async def model() -> dict[str, Any]:
        return {
            "text": "hi",
            "model": "small-1",
            "provider": "acme",
            "usage": {"inputTokens": 12, "outputTokens": 3, "costUsd": 0.0015},
        }

    @app.tool("boom")
    async def boom() -> None:
        raise RuntimeError("the tool broke")

    return app


async def drive(store: Store, app: lantern.App, run_id: str, worker: str = "w1") -> Any:
    async with Worker(store, app, worker_id=worker, lease_ttl=60) as w:
        assert w.runner is not None
        return await w.runner.drive(run_id)


CHAIN = graph("chain", [tool("a"), tool("b", "model")], [("start", "a"), ("a", "b")])


async def test_a_run_is_one_trace_its_id_derived_from_the_run_id(
    store: Store, spans: InMemorySpanExporter
) -> None:
    await apply_agent(store, CHAIN)
    run = await create_run(store, "chain", {"x": 1})
    assert (await drive(store, make_app(), run.id)).status == "succeeded"

    found = by_name(spans)
    [root] = found["run chain"]
    trace_id = tracing.trace_id_for(run.id)
    assert trace_id == int.from_bytes(hashlib.sha256(run.id.encode()).digest()[:16], "big")
    assert root.context is not None and root.context.trace_id == trace_id
    # The drive hangs off the run's synthetic remote parent, so every drive shares it.
    assert root.parent is not None and root.parent.is_remote and root.parent.trace_id == trace_id
    assert attrs(root) == {
        "lantern.run_id": run.id,
        "lantern.worker_id": "w1",
        "lantern.agent": "chain",
        "lantern.agent_version": 1,
        "lantern.workspace": "default",
        "lantern.recovered": False,
        "lantern.run_status": "succeeded",
    }
    [a] = found["step a"]
    [b] = found["step b"]
    for step, node_type in ((a, "tool"), (b, "tool")):
        assert step.context is not None and step.context.trace_id == trace_id
        assert step.parent is not None and step.parent.span_id == root.context.span_id
        assert step.status.status_code is StatusCode.UNSET
        step_id = step.name.removeprefix("step ")
        # The run id is the drive's and the idempotency key derives from the run id, the step
        # id and the attempt: neither is repeated on each step (docs/observability.md).
        assert {
            k: v for k, v in attrs(step).items() if not k.startswith(("gen_ai", "lantern.usage"))
        } == {
            "lantern.step_id": step_id,
            "lantern.node_type": node_type,
            "lantern.attempt": 1,
            "lantern.replayed": False,
        }
    # The model-shaped output's usage is on its step's span.
    assert attrs(b)["lantern.usage.input_tokens"] == 12
    assert attrs(b)["gen_ai.usage.output_tokens"] == 3
    assert attrs(b)["lantern.usage.cost_usd"] == pytest.approx(0.0015)
    assert attrs(b)["gen_ai.request.model"] == "small-1"
    assert "lantern.usage.input_tokens" not in attrs(a)


async def test_a_resumed_run_adds_its_spans_to_the_same_trace(
    store: Store, spans: InMemorySpanExporter
) -> None:
    await apply_agent(
        store,
        graph(
            "resume",
            [tool("a"), tool("b", "wait"), tool("c")],
            [
                ("start", "a"),
                ("a", "b"),
                ("b", "c"),
            ],
        ),
    )
    run = await create_run(store, "resume", {})
    gate = asyncio.Event()
    first = asyncio.create_task(drive(store, make_app(gate), run.id, "w1"))
    await asyncio.wait_for(gate.wait(), 10)
    first.cancel()  # the drive dies with b in flight; its lease is released
    with pytest.raises(asyncio.CancelledError):
        await first

    done = await drive(store, make_app(), run.id, "w2")
    assert done.status == "succeeded"

    trace_id = tracing.trace_id_for(run.id)
    finished = spans.get_finished_spans()
    assert {s.context.trace_id for s in finished if s.context is not None} == {trace_id}
    found = by_name(spans)
    drives = sorted(found["run resume"], key=lambda s: s.start_time or 0)
    assert [attrs(d)["lantern.worker_id"] for d in drives] == ["w1", "w2"]
    assert [attrs(d)["lantern.recovered"] for d in drives] == [False, True]
    assert attrs(drives[1])["lantern.from_worker"] == "w1"
    resumed = drives[1].context
    assert resumed is not None

    # a ran in the first drive and was served from the journal in the second.
    ran_a, replayed_a = sorted(found["step a"], key=lambda s: attrs(s)["lantern.replayed"])
    assert attrs(replayed_a)["lantern.replayed"] is True
    assert replayed_a.start_time == replayed_a.end_time
    assert replayed_a.parent is not None and replayed_a.parent.span_id == resumed.span_id
    assert attrs(replayed_a) == {**attrs(ran_a), "lantern.replayed": True}  # attempt 1 both
    # b was cut short mid-flight and ran again: same attempt, same key, in both drives.
    cut, rerun = sorted(found["step b"], key=lambda s: s.start_time or 0)
    assert attrs(cut)["lantern.cancelled"] is True
    assert attrs(rerun)["lantern.replayed"] is False
    assert rerun.parent is not None and rerun.parent.span_id == resumed.span_id
    assert attrs(cut)["lantern.attempt"] == attrs(rerun)["lantern.attempt"] == 1
    assert len(found["step c"]) == 1


async def test_a_failed_step_has_an_error_status(store: Store, spans: InMemorySpanExporter) -> None:
    await apply_agent(store, graph("fails", [tool("x", "boom")], [("start", "x")]))
    run = await create_run(store, "fails", {})
    assert (await drive(store, make_app(), run.id)).status == "failed"
    found = by_name(spans)
    [step] = found["step x"]
    assert step.status.status_code is StatusCode.ERROR
    assert "the tool broke" in (step.status.description or "")
    assert attrs(step)["lantern.error_class"] == "tool"
    assert [e.name for e in step.events] == ["exception"]
    [root] = found["run fails"]
    assert root.status.status_code is StatusCode.ERROR
    assert attrs(root)["lantern.run_status"] == "failed"


async def test_http_requests_carry_the_step_span_as_traceparent(
    store: Store, spans: InMemorySpanExporter, receiver: Receiver
) -> None:
    await apply_agent(store, http_chain("hooks", receiver.url, 2))
    run = await create_run(store, "hooks", {})
    assert (await drive(store, lantern.App(), run.id)).status == "succeeded"
    found = by_name(spans)
    for k in (1, 2):
        [step] = found[f"step s{k}"]
        [hit] = [h for h in receiver.hits if h.path == f"/s{k}"]
        assert step.context is not None
        version, trace_hex, span_hex, flags = hit.headers["traceparent"].split("-")
        assert (version, flags) == ("00", "01")
        assert int(trace_hex, 16) == tracing.trace_id_for(run.id)
        assert int(span_hex, 16) == step.context.span_id


async def test_with_tracing_off_nothing_is_traced_or_propagated(
    store: Store, receiver: Receiver
) -> None:
    assert not tracing.enabled()
    await apply_agent(store, http_chain("quiet", receiver.url, 1))
    run = await create_run(store, "quiet", {})
    assert (await drive(store, lantern.App(), run.id)).status == "succeeded"
    [hit] = receiver.hits
    assert "traceparent" not in hit.headers
    headers = {"X": "1"}
    tracing.inject_headers(headers)
    assert headers == {"X": "1"}


def test_export_is_configured_only_by_the_otlp_endpoint() -> None:
    assert config.Settings.from_env({}).trace_export is False
    assert tracing.configure("w1", config.trace_export({})) is False
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    disabled = {**endpoint, "OTEL_SDK_DISABLED": "true"}
    assert tracing.configure("w1", config.trace_export(disabled)) is False
    assert not tracing.enabled()
    assert config.trace_export(endpoint) is True
    assert config.trace_export({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9"})


def test_the_service_is_lantern_unless_the_environment_names_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    found = tracing.resource("w1").attributes
    assert found["service.name"] == "lantern"
    assert found["service.instance.id"] == "w1"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "agents-prod")
    assert tracing.resource("w1").attributes["service.name"] == "agents-prod"
    # Its hash is computed once (the exporter hashes it for every span) and is the SDK's.
    plain = Resource(dict(found), tracing.resource("w1").schema_url)
    assert tracing.resource("w1") != plain  # the service name differs
    monkeypatch.delenv("OTEL_SERVICE_NAME")
    assert tracing.resource("w1") == plain and hash(tracing.resource("w1")) == hash(plain)


async def test_trace_id_ratio_sampling_keeps_or_drops_whole_runs(store: Store) -> None:
    """With OTEL_TRACES_SAMPLER=traceidratio every replica decides alike for a run, since
    the trace id is derived from the run id: a run is traced whole or not at all."""
    exporter = InMemorySpanExporter()
    sampler = TraceIdRatioBased(0.5)
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)

    def sampled(run_id: str) -> bool:
        return tracing.trace_id_for(run_id) & TraceIdRatioBased.TRACE_ID_LIMIT < sampler.bound

    try:
        await apply_agent(store, CHAIN)
        runs = [await create_run(store, "chain", {"x": n}) for n in range(8)]
        while len({sampled(r.id) for r in runs}) < 2:  # all in or all out: 1 in 128
            runs.append(await create_run(store, "chain", {"x": len(runs)}))
        for run in runs:
            assert (await drive(store, make_app(), run.id)).status == "succeeded"
    finally:
        tracing.shutdown()
    traced = {run_of(s, runs) for s in exporter.get_finished_spans()}
    expected = {r.id for r in runs if sampled(r.id)}
    assert traced == expected and 0 < len(expected) < len(runs)
    for run_id in expected:  # every span of a sampled run: the drive and steps a and b
        spans = [s for s in exporter.get_finished_spans() if run_of(s, runs) == run_id]
        assert sorted(s.name for s in spans) == ["run chain", "step a", "step b"]


async def test_a_run_left_out_by_the_sampler_tells_its_requests_so(
    store: Store, receiver: Receiver
) -> None:
    """A run its sampler leaves out makes no spans at all (its steps make none either), and
    its requests still carry the run's trace id, marked not sampled, so the services it calls
    leave it out too."""
    exporter = InMemorySpanExporter()
    sampler = TraceIdRatioBased(0.5)
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)

    def sampled(run_id: str) -> bool:
        return tracing.trace_id_for(run_id) & TraceIdRatioBased.TRACE_ID_LIMIT < sampler.bound

    try:
        await apply_agent(store, http_chain("hooks", receiver.url, 2))
        runs = [await create_run(store, "hooks", {}) for _ in range(2)]
        while len({sampled(r.id) for r in runs}) < 2:  # one run of each kind, at least
            runs.append(await create_run(store, "hooks", {}))
        for run in runs:
            assert (await drive(store, lantern.App(), run.id)).status == "succeeded"
    finally:
        tracing.shutdown()
    traced = {run_of(s, runs) for s in exporter.get_finished_spans()}
    left_out = [r for r in runs if r.id not in traced]
    assert [r.id for r in left_out] == [r.id for r in runs if not sampled(r.id)]
    flags: dict[int, set[str]] = {}
    for hit in receiver.hits:
        _, trace_hex, _, flag = hit.headers["traceparent"].split("-")
        flags.setdefault(int(trace_hex, 16), set()).add(flag)
    for run in runs:
        assert flags[tracing.trace_id_for(run.id)] == ({"00"} if run in left_out else {"01"})
