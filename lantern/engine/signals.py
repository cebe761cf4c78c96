"""Signals (docs/signals.md): sending one to a run, and what resolves a signal wait.

A signal is stored when it is sent (``send``), durably and before the API answers, with its
run made due if it is parked; it waits there until a signal wait takes it. A wait is a
``step_waiting`` ``{"kind": "signal", "name"[, "dueAt"]}`` parked like an approval (no lease,
no slot); whoever drives the run next asks ``resolved``, and the step ledger decides which
stored signal the wait takes (``Ledger.signal``), journaled as ``signal_received`` with the
payload as the step's output. The journal, not the store, says which signals were taken, so
a crash between the send and the take loses nothing and a replay takes nothing twice.
"""

from __future__ import annotations

import hashlib
import re
import time
from datetime import UTC, datetime
from typing import Any

from lantern import limits
from lantern.engine.journal import fold
from lantern.engine.ledger import Ledger
from lantern.engine.payloads import SignalWait
from lantern.errors import Conflict, TooLarge, UsageError
from lantern.ids import new_signal_id
from lantern.store.base import Store
from lantern.store.codec import dumps, value_problem
from lantern.store.records import Run
from lantern.store.signals import Signal

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# A payload is journaled as the waiting step's output: the size of an agent definition keeps
# it well inside the output limit and the request body limit.
MAX_PAYLOAD_BYTES = 1024 * 1024
MAX_SIGNALS_PER_RUN = 10_000  # stored for one run, taken or not: a wait reads its name's

# (the step_resumed data, the waiting step's output)
Resolution = tuple[dict[str, Any], Any]


def check_name(name: Any, call: str = "signal") -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise UsageError(
            f"{call}: a signal name is 1-100 letters, digits, '.', '_' or '-', starting with"
            f" a letter or digit; got {name!r}"
        )
    return name


def wait(name: str, timeout_ms: int | None, *, envelope: bool = False) -> dict[str, Any]:
    """The ``step_waiting`` data of a wait for the signal ``name``, timing out after
    ``timeout_ms`` from now (None: never)."""
    due = None if timeout_ms is None else int(time.time() * 1000) + int(timeout_ms)
    return SignalWait(name, due, envelope).data()


async def send(
    store: Store, run: Run, name: str, payload: Any, idempotency_key: str | None = None
) -> Signal:
    """Store the signal ``name`` with ``payload`` for ``run``, durably, and wake the run if it
    is parked; a send repeated under ``idempotency_key`` returns the first one's signal.
    UsageError/TooLarge for a bad name or payload, Conflict for a finished run or a key
    reused for another signal."""
    check_name(name)
    if limits.size_exceeds(payload, MAX_PAYLOAD_BYTES):
        raise TooLarge(f"the signal's payload is past the limit of {MAX_PAYLOAD_BYTES} bytes")
    problem = value_problem(payload)
    if problem is not None:
        raise UsageError(f"the signal's payload cannot be stored: {problem}")
    body = dumps([name, payload])
    if len(body.encode()) > MAX_PAYLOAD_BYTES:
        raise TooLarge(f"the signal's payload is past the limit of {MAX_PAYLOAD_BYTES} bytes")
    digest = hashlib.sha256(body.encode()).hexdigest()
    made = Signal(new_signal_id(), run.id, name, payload, datetime.now(UTC))
    added = await store.add_signal(
        made,
        idempotency_key=idempotency_key,
        request_digest=digest,
        limit=MAX_SIGNALS_PER_RUN,
        wake_after=await _wake_after(store, run, name),
    )
    if not added.created and added.request_digest != digest:
        raise Conflict(f"idempotency key {idempotency_key!r} was used for a different signal")
    return added.signal


async def _wake_after(store: Store, run: Run, name: str) -> int | None:
    """When the send should wake the run: None (if it is parked) when its journal has a wait
    for ``name``; else the journal's last sequence number, so the store wakes it only if the
    journal moved on meanwhile (a wait that began since). A parked run is then never re-driven
    for a signal it does not wait for, which would replay it for nothing."""
    if run.status not in ("running", "waiting"):
        return 0 if run.status == "queued" else None
    state = fold(await store.events(run.id))
    waits = (SignalWait.read(w) for w in state.waiting.values())
    if any(w is not None and w.name == name for w in waits):
        return None
    return state.last_seq


async def resolved(store: Store, ledger: Ledger, step: str) -> Resolution | None:
    """What resolves the signal wait ``step`` now (the ledger decides), or None."""
    wait = SignalWait.read(ledger.waiting.get(step, {}))
    if wait is None:
        return None
    found = await store.signals(ledger.run_id, wait.name)
    return ledger.signal(step, found, int(time.time() * 1000))
