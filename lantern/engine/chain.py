"""The tamper-evident journal: each event's hash covers its canonical form and the hash of
the event before it, so changing any event breaks every hash after it.

    hash(n) = sha256( hash(n-1) as lowercase hex  ||  "."  ||  canonical(event n) )

with ``hash(0)`` = 64 zeros. ``canonical`` is the RFC 8785 JSON of ``{runId, seq, kind,
stepId, nodeId, attempt, atMs, data}`` (``atMs``: the event time in whole milliseconds; an
output stored as a blob is covered through the content digest in ``data.outputRef``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from lantern.store.codec import canonical_json, is_plain

GENESIS = "0" * 64


def canonical(
    run_id: str,
    seq: int,
    kind: str,
    step_id: str | None,
    node_id: str | None,
    attempt: int | None,
    at: datetime,
    data: Any,
) -> bytes:
    # The envelope is plain by construction (strings, small integers, None): only the data
    # needs the walk that decides whether the standard library may write it.
    event = {
        "runId": run_id,
        "seq": seq,
        "kind": kind,
        "stepId": step_id,
        "nodeId": node_id,
        "attempt": attempt,
        "atMs": round(at.timestamp() * 1000),
        "data": data,
    }
    return canonical_json(event, plain=is_plain(data))


def link(previous: str, body: bytes) -> str:
    return hashlib.sha256(previous.encode() + b"." + body).hexdigest()


def first_broken(events: Sequence[Any]) -> tuple[int, str] | None:
    """The seq of the first event whose hash does not match, and why; None when all do."""
    previous = GENESIS
    for expected_seq, e in enumerate(events, start=1):
        if e.seq != expected_seq:
            return e.seq, f"expected event {expected_seq} here (an event is missing)"
        body = canonical(e.run_id, e.seq, e.kind, e.step_id, e.node_id, e.attempt, e.at, e.data)
        if e.hash is None:
            return e.seq, "it has no hash"
        if link(previous, body) != e.hash:
            return e.seq, "its hash does not match its content and the hash before it"
        previous = e.hash
    return None
