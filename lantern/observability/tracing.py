"""W3C trace context on outgoing requests (a minimal version; the tracing issue extends it)."""

from __future__ import annotations

from opentelemetry import propagate


def inject_headers(headers: dict[str, str]) -> None:
    """Add ``traceparent``/``tracestate`` for the current span, if any, to ``headers``."""
    propagate.inject(headers)
