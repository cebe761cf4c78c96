"""OpenTelemetry traces: one trace per run, however many drives and replicas it takes.

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set:
then ``lantern serve`` installs an SDK tracer provider exporting OTLP/HTTP, configured by the
standard ``OTEL_*`` variables (headers, timeout, compression, ``OTEL_BSP_*`` batching,
``OTEL_TRACES_SAMPLER``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME`` — "lantern" when
unset). Otherwise no provider exists and every hook below returns after one ``None`` check.

The design:

- **Trace id from the run id**: the first 16 bytes of ``sha256(run_id)``; bytes 16..24 are the
  span id of a synthetic *remote* parent (sampled) that every drive span is a child of. So a
  run's first drive, and every resume on any replica after a crash, add their spans to the same
  trace with no coordination; that parent span itself is never exported.
- **A span per drive** ``run <agent>``: ``lantern.run_id``, ``lantern.worker_id``,
  ``lantern.agent``, ``lantern.recovered`` (and on a resume ``lantern.recovery`` and
  ``lantern.from_worker``), and the status the run reached when the drive ended.
- **A span per step attempt** ``step <id>``, a child of its drive's span and *current* while
  the step runs (so ``inject_headers`` puts it in ``traceparent``): ``lantern.step_id``,
  ``lantern.node_type``, ``lantern.attempt``, ``lantern.replayed`` (false), token usage when
  the output carries ``usage`` (and ``gen_ai.*`` when it names its model and provider), and an
  error status when it fails. The run id is its drive's (``lantern.run_id`` there) and the
  idempotency key derives from the three (``lantern.ids.idempotency_key``): neither is repeated
  on every step, each attribute costing every step's span its validation and its encoding. A
  step with no drive span above it (a microVM's) carries ``lantern.run_id`` itself.
- **Replayed steps**: a re-drive serves finished steps from the journal without invoking them;
  each gets a zero-length span with the same attributes and ``lantern.replayed=true`` (with the
  attempt the journal recorded), so a trace viewer shows every step of the run on every drive,
  the replayed ones marked.

A process killed mid-step never exports that step's span (OpenTelemetry exports ended spans);
the re-run on the next drive has the same attempt and idempotency key.

This module is a leaf: it takes plain values (ids, types, attempts) and the ``RunFacts`` it
declares, never the engine's graphs, states or step contexts, so providers, effects and the
engine may all import it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
)

from lantern import __version__
from lantern.errors import StepError


class RunFacts(Protocol):
    """What a drive's span says about its run (``lantern.store.records.Run`` has it)."""

    @property
    def id(self) -> str: ...
    @property
    def agent_name(self) -> str: ...
    @property
    def agent_version(self) -> int: ...
    @property
    def workspace(self) -> str: ...


class RunEnd(Protocol):
    """How a drive ended: the run's status and error."""

    @property
    def status(self) -> str: ...
    @property
    def error(self) -> Any: ...


# A step served from the journal on a re-drive: (step id, node type, attempt).
Replayed = tuple[str, str, int]

log = logging.getLogger("lantern.tracing")

# The one switch every hook reads first: None means tracing is off and costs nothing.
_tracer: trace.Tracer | None = None
_provider: TracerProvider | None = None
# False inside a drive whose span its sampler left out: its steps make no spans either.
_recording: ContextVar[bool] = ContextVar("lantern_trace_recording", default=True)
# The run whose steps have no drive span above them to carry its id (``in_run``).
_loose_run: ContextVar[str | None] = ContextVar("lantern_trace_loose_run", default=None)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def enabled() -> bool:
    return _tracer is not None


def trace_id_for(run_id: str) -> int:
    """The run's trace id: the first 16 bytes of sha256(run_id), as OpenTelemetry's integer."""
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:16], "big")


def run_context(run_id: str) -> otel_context.Context:
    """A context whose (remote, sampled) parent puts a span in the run's trace: the trace id
    and the parent's span id are bytes 0..16 and 16..24 of one sha256(run_id)."""
    digest = hashlib.sha256(run_id.encode()).digest()
    parent = SpanContext(
        trace_id=int.from_bytes(digest[:16], "big"),
        span_id=int.from_bytes(digest[16:24], "big"),
        is_remote=True,
        trace_flags=_SAMPLED,
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


# -- set-up --------------------------------------------------------------------------------


def configure(worker_id: str, export: bool) -> bool:
    """Install OTLP/HTTP export when the settings ask for it (``Settings.trace_export``: the
    standard endpoint variable is set); the exporter reads the other OTEL_* variables."""
    if not export:
        return False
    # Imported here: the exporter (and protobuf) load only in processes that export.
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from lantern.observability.otlp import SpanExporter

    provider = TracerProvider(resource=resource(worker_id))
    provider.add_span_processor(BatchSpanProcessor(SpanExporter()))
    install(provider)
    # Global too, so spans a user's tool makes nest under its step's span.
    trace.set_tracer_provider(provider)
    log.info(
        "tracing: exporting OTLP/HTTP spans (service %s)",
        provider.resource.attributes.get("service.name"),
    )
    return True


def resource(worker_id: str) -> Resource:
    """``service.name`` lantern unless OTEL_SERVICE_NAME/OTEL_RESOURCE_ATTRIBUTES name one."""
    found = Resource.create(
        {
            "service.instance.id": worker_id,
            "service.version": __version__,
            "process.pid": os.getpid(),
        }
    )
    if str(found.attributes.get("service.name", "")).startswith("unknown_service"):
        found = found.merge(Resource({"service.name": "lantern"}))
    return _HashedResource(found.attributes, found.schema_url)


class _HashedResource(Resource):
    """A Resource whose hash is computed once. The OTLP encoder groups every span it exports
    by its resource, hashing it each time, and ``Resource.__hash__`` serializes the resource's
    attributes to JSON: about 10 µs per exported span. A Resource never changes, so its hash
    need not be recomputed."""

    def __init__(self, attributes: Mapping[str, Any], schema_url: str | None = None) -> None:
        super().__init__(dict(attributes), schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


def install(provider: TracerProvider | None) -> None:
    """Trace through ``provider`` (tests and the bench install their own); None: stop tracing,
    leaving the provider to its owner."""
    global _tracer, _provider
    _provider = provider
    _tracer = None if provider is None else provider.get_tracer("lantern", __version__)


def shutdown() -> None:
    """Flush what is buffered and stop; tracing is off afterwards."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


# -- drives --------------------------------------------------------------------------------


@contextmanager
def drive(run: RunFacts, worker_id: str) -> Iterator[None]:
    """The span of one drive of ``run``, current for the drive (so its steps are children).

    Attached by hand rather than with ``start_as_current_span``, whose context manager and
    ``use_span`` wrap every drive in two more layers of exception handling that the options
    below turn off anyway. A drive its sampler leaves out (``OTEL_TRACES_SAMPLER``) makes
    no step spans: none would be exported, and the drive's span, current throughout, still
    tells a request's ``traceparent`` that the trace is not sampled.
    """
    tracer = _tracer
    if tracer is None:
        yield
        return
    span = tracer.start_span(
        f"run {run.agent_name}",
        context=run_context(run.id),
        attributes={
            "lantern.run_id": run.id,
            "lantern.worker_id": worker_id,
            "lantern.agent": run.agent_name,
            "lantern.agent_version": run.agent_version,
            "lantern.workspace": run.workspace,
            "lantern.recovered": False,
        },
        record_exception=False,
        set_status_on_exception=False,
    )
    token = otel_context.attach(trace.set_span_in_context(span))
    recording = _recording.set(span.is_recording())
    try:
        yield
    except Exception as exc:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        _recording.reset(recording)
        otel_context.detach(token)
        span.end()


def drive_ended(result: RunEnd | None) -> None:
    """What the drive came to: the run's status, or that another worker has it."""
    if _tracer is None:
        return
    span = trace.get_current_span()
    if result is None:
        span.set_attribute("lantern.run_status", "not_held")
        return
    span.set_attribute("lantern.run_status", result.status)
    if result.status == "failed":
        span.set_status(Status(StatusCode.ERROR, _message(result.error)))


def recovered(replayed: Iterable[Replayed], from_worker: str | None, attempt: int) -> None:
    """Mark the current drive a resume and give each step served from the journal its span."""
    tracer = _tracer
    if tracer is None or not _recording.get():
        return
    span = trace.get_current_span()
    span.set_attribute("lantern.recovered", True)
    span.set_attribute("lantern.recovery", attempt)
    if from_worker:
        span.set_attribute("lantern.from_worker", from_worker)
    now = time.time_ns()
    current = otel_context.get_current()
    for step_id, node_type, step_attempt in replayed:
        replay = tracer.start_span(
            f"step {step_id}",
            current,
            attributes={
                "lantern.step_id": step_id,
                "lantern.node_type": node_type,
                "lantern.attempt": step_attempt,
                "lantern.replayed": True,
            },
            start_time=now,
            record_exception=False,
            set_status_on_exception=False,
        )
        replay.end(end_time=now)


# -- steps ---------------------------------------------------------------------------------


class StepSpan:
    """The span of one step attempt, current in the step's task from start to end."""

    __slots__ = ("_span", "_token")

    def __init__(
        self,
        tracer: trace.Tracer,
        step_id: str,
        node_type: str,
        attempt: int,
    ) -> None:
        # The current context (the drive's span) handed on, not looked up again by the SDK
        # for the parent, by the sampler and by ``set_span_in_context`` below.
        current = otel_context.get_current()
        self._span = tracer.start_span(
            f"step {step_id}",
            current,
            attributes=_step_attributes(step_id, node_type, attempt, _loose_run.get()),
            record_exception=False,
            set_status_on_exception=False,
        )
        self._token = otel_context.attach(trace.set_span_in_context(self._span, current))

    def succeeded(self, output: Any) -> None:
        _succeeded(self._span, output)
        self._end()

    def failed(self, exc: BaseException) -> None:
        _failed(self._span, exc)
        self._end()

    def _end(self) -> None:
        otel_context.detach(self._token)
        self._span.end()


def _step_attributes(
    step_id: str, node_type: str, attempt: int, loose_run: str | None
) -> dict[str, Any]:
    """What every step span carries, whether the step ran here or in a microVM; the run id
    only on a step with no drive span above it (``loose_run``) to carry it."""
    found: dict[str, Any] = {
        "lantern.step_id": step_id,
        "lantern.node_type": node_type,
        "lantern.attempt": attempt,
        "lantern.replayed": False,
    }
    if loose_run is not None:
        found["lantern.run_id"] = loose_run
    return found


def _succeeded(span: trace.Span, output: Any) -> None:
    usage = output.get("usage") if isinstance(output, dict) else None
    if isinstance(usage, dict):
        span.set_attributes(usage_attributes(output, usage))


def _failed(span: trace.Span, exc: BaseException) -> None:
    if isinstance(exc, StepError):
        span.set_attribute("lantern.error_class", exc.error_class)
        span.set_attribute("lantern.retryable", exc.retryable)
    if isinstance(exc, Exception):
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    else:  # cancelled: a clean stop or a cancellation request, not the step's fault
        span.set_attribute("lantern.cancelled", True)


@contextmanager
def in_run(run_id: str) -> Iterator[None]:
    """Make the run's trace current (for the step spans of a run driven from requests, such
    as a microVM's, which have no drive span to nest under)."""
    if _tracer is None:
        yield
        return
    token = otel_context.attach(run_context(run_id))
    loose = _loose_run.set(run_id)
    try:
        yield
    finally:
        _loose_run.reset(loose)
        otel_context.detach(token)


def reported_step(
    run_id: str,
    step_id: str,
    node_type: str,
    attempt: int,
    started_ns: int,
    outcome: Any,
) -> None:
    """The span of a step attempt that ran elsewhere (a microVM workload's own ``ctx.step``),
    in the run's trace: from when the control plane let the attempt start (``started_ns``)
    to now, when its outcome (a value or a StepError) was reported."""
    tracer = _tracer
    if tracer is None:
        return
    span = tracer.start_span(
        f"step {step_id}",
        run_context(run_id),
        attributes=_step_attributes(step_id, node_type, attempt, run_id),
        start_time=started_ns,
        record_exception=False,
        set_status_on_exception=False,
    )
    if isinstance(outcome, StepError):
        _failed(span, outcome)
    else:
        _succeeded(span, outcome)
    span.end()


def start_step(step_id: str, node_type: str, attempt: int) -> StepSpan | None:
    """The span of one step attempt, current from here until it ends (None: tracing off)."""
    tracer = _tracer
    if tracer is None or not _recording.get():
        return None
    return StepSpan(tracer, step_id, node_type, attempt)


def usage_attributes(output: Mapping[str, Any], usage: Mapping[str, Any]) -> dict[str, Any]:
    """Token usage as span attributes: Lantern's names, and the GenAI conventions' too."""
    found: dict[str, Any] = {}
    for key, name, gen_ai in (
        ("inputTokens", "lantern.usage.input_tokens", "gen_ai.usage.input_tokens"),
        ("outputTokens", "lantern.usage.output_tokens", "gen_ai.usage.output_tokens"),
    ):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            found[name] = found[gen_ai] = value
    cost = usage.get("costUsd")
    if isinstance(cost, int | float) and not isinstance(cost, bool):
        found["lantern.usage.cost_usd"] = float(cost)
    if isinstance(output.get("model"), str):
        found["gen_ai.request.model"] = output["model"]
    if isinstance(output.get("provider"), str):
        found["gen_ai.system"] = output["provider"]
    return found


def inject_headers(headers: dict[str, str]) -> None:
    """Add the current span's W3C ``traceparent`` (and ``tracestate``) to outgoing headers.

    Ours replaces a header of the same name in any case, so a request carries one.
    """
    if _tracer is None:
        return
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:
        return
    names = {k.lower() for k in carrier}
    for name in [k for k in headers if k.lower() in names]:
        del headers[name]
    headers.update(carrier)


def _message(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error.get("code") or "failed")
    return "failed"
