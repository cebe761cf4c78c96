"""OTLP's protobuf encoding of finished spans, written out directly.

The OTLP/HTTP exporter turns each batch into an ``ExportTraceServiceRequest`` by building a
protobuf object per span, attribute and value, then serializing them: under ``lantern serve``
that was the costliest part of tracing, about twice what starting and ending the span costs,
on the exporter's thread but holding the GIL the event loop needs. The bytes are simple to
write by hand (varints, length-delimited fields, fixed64 times), and this writes the same
message in a fraction of the time. ``install`` makes the OTLP/HTTP trace exporter use it;
everything else about the export (endpoint, headers, compression, retries) stays its own.

Span fields are those of ``opentelemetry/proto/trace/v1/trace.proto``; field numbers and wire
types are cited where written. Fields equal to their default are left out, as protobuf's own
serializer does.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind
from opentelemetry.trace.status import Status

_KIND = {  # SpanKind -> Span.SpanKind (UNSPECIFIED is 0)
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
_HAS_IS_REMOTE = 0x100  # SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = 0x200  # SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_pack_fixed64 = struct.Struct("<Q").pack
_pack_fixed32 = struct.Struct("<I").pack
_pack_double = struct.Struct("<d").pack


_ONE_BYTE = [bytes((n,)) for n in range(0x80)]


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _uint(n: int) -> bytes:
    """A varint of an integer field: int64's negatives as their two's complement."""
    return _varint(n & 0xFFFFFFFFFFFFFFFF) if n < 0 else _varint(n)


_KEYS = [bytes((tag << 3 | 2,)) for tag in range(16)]  # length-delimited, fields 0..15


def _field(tag: int, body: bytes) -> bytes:
    """A length-delimited field (wire type 2): its key, the body's length, the body."""
    n = len(body)
    return _KEYS[tag] + (_ONE_BYTE[n] if n < 0x80 else _varint(n)) + body


def _text(tag: int, value: str) -> bytes:
    return _field(tag, value.encode("utf-8")) if value else b""


# -- common/v1: AnyValue, KeyValue -----------------------------------------------------------


def _any(value: Any) -> bytes:
    """An AnyValue's body: string 1, bool 2, int 3, double 4, array 5, bytes 7."""
    if isinstance(value, str):
        return _field(1, value.encode("utf-8"))
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _uint(value)
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if isinstance(value, bytes):
        return _field(7, value)
    if isinstance(value, Sequence):  # ArrayValue: repeated AnyValue values = 1
        return _field(5, b"".join(_field(1, _any(v)) for v in value))
    if isinstance(value, Mapping):  # KeyValueList: repeated KeyValue values = 1
        return _field(6, _attributes(1, value))
    return _field(1, str(value).encode("utf-8"))


# An attribute's KeyValue, by (key, value) for strings, bools and ints: a run's spans repeat
# most of theirs (its id, the agent, step ids, node types, attempts, flags). Bounded: cleared
# when full, so a stream of distinct values costs a lookup, not memory.
_CACHED: dict[tuple[str, type, Any], bytes] = {}
_CACHE_MAX = 4096
_SCALARS = (str, bool, int)  # not float: 0.0 == -0.0, with other bytes


def _key_value(key: str, value: Any) -> bytes:
    kind = type(value)
    if kind not in _SCALARS:
        return _field(1, key.encode("utf-8")) + _field(2, _any(value))
    found = _CACHED.get((key, kind, value))
    if found is None:
        found = _field(1, key.encode("utf-8")) + _field(2, _any(value))
        if len(_CACHED) >= _CACHE_MAX:
            _CACHED.clear()
        _CACHED[(key, kind, value)] = found
    return found


def _attributes(tag: int, attributes: Mapping[str, Any] | None) -> bytes:
    """Repeated KeyValue (key 1, value 2) under field ``tag``."""
    if not attributes:
        return b""
    return b"".join([_field(tag, _key_value(k, v)) for k, v in attributes.items()])


def _count(tag: int, n: int) -> bytes:
    return bytes((tag << 3,)) + _varint(n) if n else b""


# -- trace/v1 ---------------------------------------------------------------------------------


def _flags(parent: SpanContext | None) -> bytes:
    flags = _HAS_IS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote else 0)
    return b"\x85\x01" + _pack_fixed32(flags)  # flags = 16, fixed32


def _trace_state(context: SpanContext) -> str:
    state = context.trace_state
    return ",".join(f"{k}={v}" for k, v in state.items()) if state else ""


def _status(status: Status | None) -> bytes:
    if status is None:
        return b""
    body = _text(2, status.description or "") + _count(3, status.status_code.value)
    return _field(15, body)


def _event(event: Event) -> bytes:
    body = (
        b"\x09"  # time_unix_nano = 1, fixed64
        + _pack_fixed64(event.timestamp)
        + _text(2, event.name)
        + _attributes(3, event.attributes)
        + _count(4, getattr(event, "dropped_attributes", 0))
    )
    return _field(11, body)


def _link(link: Link) -> bytes:
    context = link.context
    body = (
        _field(1, context.trace_id.to_bytes(16, "big"))
        + _field(2, context.span_id.to_bytes(8, "big"))
        + _text(3, _trace_state(context))
        + _attributes(4, link.attributes)
        + _count(5, getattr(link, "dropped_attributes", 0))
        + b"\x35"  # flags = 6, fixed32
        + _pack_fixed32(_HAS_IS_REMOTE | (_IS_REMOTE if context.is_remote else 0))
    )
    return _field(13, body)


def span_bytes(span: ReadableSpan) -> bytes:
    """One ``Span`` message."""
    context = span.get_span_context()
    assert context is not None  # an SDK span always has one
    parent = span.parent
    parts = [
        _field(1, context.trace_id.to_bytes(16, "big")),
        _field(2, context.span_id.to_bytes(8, "big")),
        _text(3, _trace_state(context)),
        _field(4, parent.span_id.to_bytes(8, "big")) if parent is not None else b"",
        _text(5, span.name),
        _count(6, _KIND.get(span.kind, 0)),
        b"\x39" + _pack_fixed64(span.start_time or 0),  # start_time_unix_nano = 7
        b"\x41" + _pack_fixed64(span.end_time or 0),  # end_time_unix_nano = 8
        _attributes(9, span.attributes),
        _count(10, span.dropped_attributes),
        b"".join(_event(e) for e in span.events),
        _count(12, span.dropped_events),
        b"".join(_link(k) for k in span.links),
        _count(14, span.dropped_links),
        _status(span.status),
        _flags(parent),
    ]
    return b"".join(parts)


def _scope(scope: InstrumentationScope | None) -> bytes:
    """ScopeSpans.scope = 1: InstrumentationScope (name 1, version 2, attributes 3)."""
    if scope is None:
        return b""
    body = (
        _text(1, scope.name)
        + _text(2, scope.version or "")
        + _attributes(3, getattr(scope, "attributes", None))
    )
    return _field(1, body)


def request_bytes(spans: Sequence[ReadableSpan]) -> bytes:
    """An ``ExportTraceServiceRequest``: resource_spans = 1, grouped by resource, then by
    instrumentation scope, as the SDK's encoder groups them (equal resources together)."""
    by_id: dict[int, tuple[Resource, dict[InstrumentationScope | None, list[bytes]]]] = {}
    for span in spans:
        resource = span.resource
        # Keyed by identity, not by the resource's hash (its attributes as JSON): a batch
        # has one or two resource objects, merged below when equal.
        scopes = by_id.setdefault(id(resource), (resource, {}))[1]
        scopes.setdefault(span.instrumentation_scope or None, []).append(span_bytes(span))
    grouped: list[tuple[Resource, dict[InstrumentationScope | None, list[bytes]]]] = []
    for resource, scopes in by_id.values():
        for known, known_scopes in grouped:
            if known == resource:
                for scope, encoded in scopes.items():
                    known_scopes.setdefault(scope, []).extend(encoded)
                break
        else:
            grouped.append((resource, scopes))
    out = []
    for resource, scopes in grouped:
        scope_spans = b"".join(
            _field(
                2,  # ResourceSpans.scope_spans = 2
                _scope(scope)
                + b"".join([_field(2, s) for s in encoded])  # ScopeSpans.spans = 2
                + _text(3, (scope.schema_url if scope is not None else "") or ""),
            )
            for scope, encoded in scopes.items()
        )
        body = (
            _field(1, _attributes(1, resource.attributes))  # Resource: attributes = 1
            + scope_spans
            + _text(3, resource.schema_url or "")
        )
        out.append(_field(1, body))
    return b"".join(out)


class _Request:
    """What the exporter calls ``SerializePartialToString`` on."""

    __slots__ = ("_spans",)

    def __init__(self, spans: Sequence[ReadableSpan]) -> None:
        self._spans = spans

    def SerializePartialToString(self) -> bytes:  # protobuf's name, as the exporter calls it
        return request_bytes(self._spans)

    SerializeToString = SerializePartialToString


def encode_spans(spans: Sequence[ReadableSpan]) -> _Request:
    return _Request(spans)


def install() -> bool:
    """Make the OTLP/HTTP trace exporter encode with this module; False when its module does
    not name ``encode_spans`` (an exporter release that encodes differently keeps its own)."""
    from opentelemetry.exporter.otlp.proto.http import trace_exporter

    if not callable(getattr(trace_exporter, "encode_spans", None)):
        return False
    trace_exporter.encode_spans = encode_spans  # type: ignore[attr-defined,assignment]
    return True
