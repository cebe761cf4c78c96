"""Lantern's span encoding writes the bytes OpenTelemetry's own OTLP encoding writes, for every
span shape a drive, a step, a microVM's report and an HTTP request make; anything else goes
through the library's encoding; the exporter sends either to a real OTLP/HTTP receiver."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from lantern.errors import StepError
from lantern.observability import otlp, tracing
from tests.otlp import running


class Run:
    id = "run_0123"
    agent_name = "triage"
    agent_version = 3
    workspace = "acme"


@pytest.fixture
def provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    memory = InMemorySpanExporter()
    found = TracerProvider(resource=tracing.resource("w1"))
    found.add_span_processor(SimpleSpanProcessor(memory))
    tracing.install(found)
    try:
        yield found, memory
    finally:
        tracing.install(None)


def lanterns_spans() -> None:
    """A drive, its steps (one with model usage), a resumed drive's replayed steps, a microVM
    step reported over the API, and the step of a run with no drive span above it."""
    with tracing.drive(Run(), "w1"):
        tracing.start_step("plan", "code", 1).succeeded({"answer": 42})  # type: ignore[union-attr]
        tracing.start_step("ask", "llm", 2).succeeded(  # type: ignore[union-attr]
            {
                "usage": {"inputTokens": 1200, "outputTokens": 0, "costUsd": 0.0031},
                "model": "gpt-5",
                "provider": "openai",
            }
        )
        tracing.recovered([("plan", "code", 1), ("ask", "llm", 2)], "w0", 1)
    tracing.reported_step(Run.id, "inside", "code", 1, time.time_ns() - 1000, {"ok": True})
    with tracing.in_run(Run.id):
        tracing.start_step("loose", "tool", 1).succeeded(None)  # type: ignore[union-attr]


def test_lanterns_spans_are_the_bytes_the_library_writes(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    _, memory = provider
    lanterns_spans()
    spans = memory.get_finished_spans()
    assert len(spans) == 7
    assert otlp.encode(spans) == encode_spans(spans).SerializePartialToString()


def test_every_scalar_kind_status_scope_and_trace_state_as_the_library_writes(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    found, memory = provider
    other = found.get_tracer("tool.http", "2.1", schema_url="https://opentelemetry.io/schemas/1.26")
    state = TraceState([("vendor", "abc"), ("lantern", "x1")])
    remote = SpanContext(7, 9, is_remote=True, trace_flags=TraceFlags(1), trace_state=state)
    for kind in SpanKind:
        with other.start_as_current_span(
            f"GET /v1/runs {kind.name}",
            context=set_span_in_context(NonRecordingSpan(remote)),
            kind=kind,
            attributes={
                "http.request.method": "GET",
                "http.response.status_code": 200,
                "big": 2**63 - 1,
                "small": -(2**63),
                "negative": -1,
                "zero": 0,
                "yes": True,
                "no": False,
                "ratio": -0.0,
                "half": 0.5,
                "empty": "",
                "ünïcode": "日本語",
                "long": "x" * 70_000,
                "raw": b"\x00\xff",
            },
        ) as span:
            if kind is SpanKind.CLIENT:
                span.set_status(Status(StatusCode.ERROR, "the peer answered 503"))
            elif kind is SpanKind.SERVER:
                span.set_status(Status(StatusCode.OK))
    root = found.get_tracer("lantern").start_span("orphan")  # no parent
    root.end()
    spans = memory.get_finished_spans()
    assert otlp.encode(spans) == encode_spans(spans).SerializePartialToString()
    # Twice: the second encoding is served from the encoded attributes kept by the first.
    assert otlp.encode(spans) == encode_spans(spans).SerializePartialToString()


def test_a_resource_with_a_schema_and_spans_of_two_resources() -> None:
    spans: list[ReadableSpan] = []
    for name, schema in (("a", "https://example.com/s/1"), ("b", None)):
        memory = InMemorySpanExporter()
        found = TracerProvider(resource=Resource({"service.name": name}, schema))
        found.add_span_processor(SimpleSpanProcessor(memory))
        found.get_tracer("lantern").start_span("one").end()
        spans.extend(memory.get_finished_spans())
    assert otlp.encode(spans) == encode_spans(spans).SerializePartialToString()


def test_a_batch_holding_another_shape_is_left_to_the_library(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    found, memory = provider
    with tracing.drive(Run(), "w1"):
        tracing.start_step("ok", "code", 1).succeeded(None)  # type: ignore[union-attr]
        # A failed step records its exception: an event on the span.
        tracing.start_step("boom", "tool", 1).failed(  # type: ignore[union-attr]
            StepError("it broke", error_class="tool", retryable=True)
        )
    plain = [s for s in memory.get_finished_spans() if not s.events]
    assert otlp.encode(plain) is not None
    assert otlp.encode(memory.get_finished_spans()) is None
    memory.clear()
    found.get_tracer("x").start_span("tags", attributes={"tags": ["a", "b"]}).end()
    assert otlp.encode(memory.get_finished_spans()) is None


def test_the_exporter_sends_both_kinds_of_batch_to_a_receiver(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    _, memory = provider
    lanterns_spans()
    with tracing.drive(Run(), "w1"):
        tracing.start_step("boom", "tool", 1).failed(  # type: ignore[union-attr]
            StepError("it broke", error_class="tool")
        )
    spans = memory.get_finished_spans()
    with running() as receiver:
        exporter = otlp.SpanExporter(endpoint=f"{receiver.url}/v1/traces")
        try:
            assert exporter.export(spans[:7]) is SpanExportResult.SUCCESS
            assert exporter.export(spans[7:]) is SpanExportResult.SUCCESS  # has an event
        finally:
            exporter.shutdown()  # type: ignore[no-untyped-call]
        got = receiver.received()
    assert [s.name for s in got] == [s.name for s in spans]
    ask = next(s for s in got if s.name == "step ask" and not s.attributes["lantern.replayed"])
    assert ask.attributes["lantern.usage.cost_usd"] == 0.0031
    assert ask.attributes["gen_ai.request.model"] == "gpt-5"
    assert ask.resource["service.name"] == "lantern"
    assert next(s for s in got if s.name == "step boom").status_code == 2
    assert receiver.paths == ["/v1/traces", "/v1/traces"]
