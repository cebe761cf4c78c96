"""OTLP/HTTP span export whose encoding is cheap enough for a span per step.

The exporter's own encoding (``encode_spans``) builds a protobuf message object per span, per
attribute and per attribute value, then serializes them: 19-22 µs a span here, against about
7 for ``encode``. It runs on the export thread but holds the interpreter's lock throughout, so
a busy server's steps wait for it (a tenth of ``lantern serve``'s samples at 32 runs at a
time, docs/observability.md). The spans Lantern makes (a run's drive, its steps, the HTTP
requests) are one plain shape: ids, a name, a kind, two times, scalar attributes and a status.
``encode`` writes that shape's protobuf wire format straight into bytes; a batch holding
anything else (an event, as a recorded exception is, a link, an array attribute) returns None
and goes through the library's encoding. ``tests/unit/test_otlp_encoding.py`` checks that the
bytes are the library's, byte for byte, for every shape.

Field numbers are those of opentelemetry-proto's ``trace/v1/trace.proto``,
``common/v1/common.proto`` and ``resource/v1/resource.proto``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind

_FIXED64 = struct.Struct("<Q").pack
_DOUBLE = struct.Struct("<d").pack
# SpanKind's protobuf numbers: the SDK's enum values plus one (0 is "unspecified").
_KIND = {kind: bytes([0x30, kind.value + 1]) for kind in SpanKind}
_FLAGS = (0x100).to_bytes(4, "little")  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_REMOTE_FLAGS = (0x300).to_bytes(4, "little")  # ... and SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK


class Unencodable(Exception):
    """A span this encoder does not write: the library's encoding takes the batch."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SHORT = [_varint(n) for n in range(0x4000)]  # every length below 16 KiB: two bytes at most


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, its length, its payload."""
    n = len(payload)
    return tag + (_SHORT[n] if n < 0x4000 else _varint(n)) + payload


def _value(value: Any) -> bytes:
    """An ``AnyValue``: one member of its oneof, written even when it is zero or empty."""
    if isinstance(value, bool):  # before int: a bool is an int
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise Unencodable("an int beyond int64")
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int64: two's complement
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    raise Unencodable(type(value).__name__)


# Encoded attributes by (field, key, type, value): a step's id, type and attempt recur in
# every run of its agent. Emptied when full rather than kept in order, which costs per hit.
# Not kept: floats (-0.0 and 0.0 are one key, two encodings) and long values (the memory).
_encoded: dict[tuple[bytes, str, type, Any], bytes] = {}
_ENCODED_MAX = 4096
_KEPT_LEN = 256


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """Each attribute as a ``KeyValue`` in the repeated field ``tag``."""
    if not attributes:
        return b""
    parts = []
    for key, value in attributes.items():
        known = (tag, key, type(value), value)
        found = _encoded.get(known)
        if found is None:
            found = _field(tag, _field(b"\x0a", key.encode()) + _field(b"\x12", _value(value)))
            if isinstance(value, float) or (
                isinstance(value, str | bytes) and len(value) > _KEPT_LEN
            ):
                parts.append(found)
                continue
            if len(_encoded) >= _ENCODED_MAX:
                _encoded.clear()
            _encoded[known] = found
        parts.append(found)
    return b"".join(parts)


def _span(span: ReadableSpan) -> bytes:
    if span.events or span.links:
        raise Unencodable("events or links")
    context = span.get_span_context()
    if context is None:
        raise Unencodable("no context")
    parts = [
        b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
        b"\x12\x08" + context.span_id.to_bytes(8, "big"),
    ]
    if context.trace_state:
        state = ",".join(f"{k}={v}" for k, v in context.trace_state.items())
        parts.append(_field(b"\x1a", state.encode()))
    parent = span.parent
    if parent is not None:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    parts.append(_field(b"\x2a", span.name.encode()))
    parts.append(_KIND[span.kind])
    if span.start_time:
        parts.append(b"\x39" + _FIXED64(span.start_time))
    if span.end_time:
        parts.append(b"\x41" + _FIXED64(span.end_time))
    parts.append(_attributes(b"\x4a", span.attributes))
    if span.dropped_attributes:
        parts.append(b"\x50" + _varint(span.dropped_attributes))
    status = span.status
    if status is not None:
        body = _field(b"\x12", status.description.encode()) if status.description else b""
        if status.status_code.value:
            body += b"\x18" + _varint(status.status_code.value)
        parts.append(_field(b"\x7a", body))
    parts.append(
        b"\x85\x01" + (_REMOTE_FLAGS if parent is not None and parent.is_remote else _FLAGS)
    )
    return b"".join(parts)


def _scope(scope: InstrumentationScope | None) -> bytes:
    if scope is None:
        return b""
    found = _field(b"\x0a", scope.name.encode()) if scope.name else b""
    if scope.version:
        found += _field(b"\x12", scope.version.encode())
    return found + _attributes(b"\x1a", scope.attributes)


def encode(spans: Sequence[ReadableSpan]) -> bytes | None:
    """The ``ExportTraceServiceRequest`` of ``spans``, grouped by resource and then by
    instrumentation scope as the library groups them; None when a span is not the plain shape
    this writes."""
    grouped: dict[Resource | None, dict[InstrumentationScope | None, list[bytes]]] = {}
    try:
        for span in spans:
            by_scope = grouped.setdefault(span.resource, {})
            by_scope.setdefault(span.instrumentation_scope, []).append(_field(b"\x12", _span(span)))
        out = []
        for resource, by_scope in grouped.items():
            body = _field(b"\x0a", _attributes(b"\x0a", resource.attributes if resource else None))
            for scope, encoded in by_scope.items():
                scope_spans = _field(b"\x0a", _scope(scope)) + b"".join(encoded)
                if scope is not None and scope.schema_url:
                    scope_spans += _field(b"\x1a", scope.schema_url.encode())
                body += _field(b"\x12", scope_spans)
            if resource is not None and resource.schema_url:
                body += _field(b"\x1a", resource.schema_url.encode())
            out.append(_field(b"\x0a", body))
    except Unencodable:
        return None
    return b"".join(out)


class SpanExporter(OTLPSpanExporter):
    """The library's OTLP/HTTP exporter (its settings, transport, retries and metrics) with
    ``encode`` in front of its own encoding."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        body = None if getattr(self, "_shutdown", True) else encode(spans)
        client = getattr(self, "_client", None)
        limit = getattr(self, "_max_request_size", None)
        metrics = getattr(self, "_metrics", None)
        if body is None or client is None or limit is None or metrics is None or len(body) > limit:
            # The library's own path: its encoding, its refusals and their log lines.
            return super().export(spans)
        with metrics.export_operation(len(spans)) as result:
            sent = client.export(body)
            if not sent.success:
                result.error = sent.error
                if sent.status_code is not None:
                    result.error_attrs = {"http.response.status_code": sent.status_code}
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS
