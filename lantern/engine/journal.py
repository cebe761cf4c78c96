"""Reading a run's journal into state, and writing events with bounded payloads.

A step's output lives in its ``step_completed`` event. Outputs over ``INLINE_LIMIT`` bytes are
stored once in ``blobs`` and the event holds ``{"outputRef": "sha256:...", "outputBytes": N}``,
so listing a long run's journal never drags its large payloads along. Folding events read
without their blobs gives such an output as an ``OutputRef`` (what deciding at an approval or
cancelling needs never includes the outputs); a drive reads the journal with blobs, so the
outputs its steps see are the values themselves.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from lantern.engine import events as ev
from lantern.engine.chain import GENESIS, canonical, link
from lantern.engine.payloads import StepRetrying, StepThrottled
from lantern.observability import metrics
from lantern.store.codec import dumps
from lantern.store.records import Blob, Event, NewEvent, RunUpdate

INLINE_LIMIT = 16 * 1024


@dataclass(frozen=True)
class OutputRef:
    """A step output kept as a blob that was not read with the events: its digest and size."""

    digest: str
    size: int


@dataclass
class RunState:
    """What the journal says about a run, folded from its events in order."""

    started: bool = False
    terminal: str | None = None
    last_seq: int = 0
    outputs: dict[str, Any] = field(default_factory=dict)  # step_id -> output (or OutputRef)
    attempts: dict[str, int] = field(default_factory=dict)  # step_id -> last attempt started
    failed: set[str] = field(default_factory=set)
    skipped: set[str] = field(default_factory=set)  # steps no taken edge reaches
    last_hash: str = GENESIS
    worker: str | None = None  # the last worker that drove the run
    recoveries: int = 0  # re-drives after a crash or a lost executor
    # step_id -> (the attempt to run next, when it is due in epoch ms) after a step_retrying
    retrying: dict[str, tuple[int, int]] = field(default_factory=dict)
    # step_id -> (the attempt to run again, when it is due in epoch ms) after a step_throttled
    throttled: dict[str, tuple[int, int]] = field(default_factory=dict)
    # step_id -> its step_waiting data, for steps parked at an approval or on a sub-agent
    waiting: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def in_flight(self) -> list[str]:
        """Steps started and not finished: the crash hit them mid-flight."""
        return [
            s
            for s in self.attempts
            if s not in self.outputs
            and s not in self.failed
            and s not in self.backing_off
            and s not in self.waiting
        ]

    @property
    def backing_off(self) -> dict[str, tuple[int, int]]:
        """Steps waiting out a retry backoff whose next attempt has not started, or a rate
        limit's wait (the throttled attempt starts again)."""
        found = {s: r for s, r in self.retrying.items() if r[0] > self.attempts.get(s, 0)}
        return found | self.throttled


def fold(events: Iterable[Event]) -> RunState:
    state = RunState()
    for e in events:
        fold_event(state, e)
    return state


def fold_event(state: RunState, e: Event | NewEvent) -> None:
    """Fold one event into ``state``: the only place a journal is read into a run's state
    (``fold`` for a whole journal; the step ledger for each event it writes too)."""
    state.last_seq = e.seq
    state.last_hash = e.hash or GENESIS
    kind, step = e.kind, e.step_id
    if kind == ev.RUN_STARTED:
        state.started = True
        state.worker = e.data.get("worker")
    elif kind == ev.RUN_RECOVERED:
        state.worker = e.data.get("toWorker")
        state.recoveries += 1
    elif kind == ev.RUN_RESUMED:  # woken from a park by this worker: it holds the run
        state.worker = e.data.get("worker")
    elif step is None:
        if kind in ev.TERMINAL_KINDS:
            state.terminal = kind
    elif kind == ev.STEP_STARTED:
        state.attempts[step] = e.attempt or 1
        state.throttled.pop(step, None)
    elif kind == ev.STEP_COMPLETED:
        state.outputs[step] = output_of(e)
        state.waiting.pop(step, None)
    elif kind == ev.STEP_SKIPPED:
        state.skipped.add(step)
    elif kind == ev.STEP_FAILED:
        state.failed.add(step)
        state.waiting.pop(step, None)
    elif kind == ev.STEP_RETRYING:
        retry = StepRetrying.read(e.data, e.attempt)
        state.retrying[step] = (retry.attempt, retry.due_at)
        state.waiting.pop(step, None)
    elif kind == ev.STEP_THROTTLED:
        throttled = StepThrottled.read(e.data)
        state.throttled[step] = (e.attempt or state.attempts.get(step, 1), throttled.due_at)
    elif kind == ev.STEP_WAITING:
        state.waiting[step] = dict(e.data)
    elif kind in ev.TERMINAL_KINDS:
        state.terminal = kind


def count_committed(events: Iterable[NewEvent]) -> None:
    """Count the events of one journal commit in this process's metrics."""
    for e in events:
        kind = e.kind
        metrics.journal_event(kind)
        if kind == ev.STEP_STARTED or kind == ev.STEP_COMPLETED:
            continue  # the common case, counted above alone
        if kind in ev.TERMINAL_KINDS:
            metrics.run_finished(ev.FINAL_STATUS[kind])
        elif kind == ev.RUN_STARTED:
            metrics.RUNS_STARTED.inc()
        elif kind == ev.STEP_RETRYING:
            metrics.STEP_RETRIES.inc()
        elif kind == ev.STEP_FAILED:
            metrics.STEP_FAILURES.inc()


def output_of(event: Event | NewEvent) -> Any:
    """A ``step_completed`` event's output: inline, from its blob, or a reference to the blob
    when the events were read without blobs."""
    if "outputRef" in event.data:
        blob = event.blob
        if blob is None:
            return OutputRef(str(event.data["outputRef"]), int(event.data.get("outputBytes", 0)))
        return json.loads(blob.body if isinstance(blob, Blob) else blob)
    return event.data.get("output")


class EventWriter:
    """Numbers and chains a run's new events; the run's only writer while its lease holds."""

    def __init__(self, run_id: str, last_seq: int = 0, last_hash: str = GENESIS) -> None:
        self.run_id = run_id
        self.seq = last_seq
        self.hash = last_hash

    def event(
        self,
        kind: str,
        data: dict[str, Any] | None = None,
        *,
        step_id: str | None = None,
        attempt: int | None = None,
    ) -> NewEvent:
        now = datetime.now(UTC)
        at = now.replace(microsecond=now.microsecond // 1000 * 1000)  # the chain keeps ms
        data = data or {}
        # Canonicalise before counting: a value it refuses leaves the writer unchanged.
        body = canonical(self.run_id, self.seq + 1, kind, step_id, step_id, attempt, at, data)
        self.seq += 1
        self.hash = link(self.hash, body)
        return NewEvent(
            seq=self.seq,
            kind=kind,
            at=at,
            data=data,
            step_id=step_id,
            node_id=step_id,
            attempt=attempt,
            hash=self.hash,
        )

    def completed(
        self,
        step_id: str,
        attempt: int,
        output: Any,
        encoded: str | None = None,
        *,
        usage: dict[str, Any] | None = None,
    ) -> NewEvent:
        """``encoded`` is ``output`` already serialised, when the caller has it. ``usage``, a
        model step's tokens and cost, rides beside the output: the database adds it to the
        run's totals in the same transaction (and it stays inline when the output is a blob)."""
        body = (dumps(output) if encoded is None else encoded).encode()
        extra = {} if usage is None else {"usage": usage}
        if len(body) <= INLINE_LIMIT:
            return self.event(
                ev.STEP_COMPLETED, {"output": output, **extra}, step_id=step_id, attempt=attempt
            )
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        event = self.event(
            ev.STEP_COMPLETED,
            {"outputRef": digest, "outputBytes": len(body), **extra},
            step_id=step_id,
            attempt=attempt,
        )
        return replace(event, blob=Blob(digest, body))


class Writes(Protocol):
    """What makes a run's next event: an ``EventWriter``, or the step ledger (which folds it
    in too)."""

    def event(
        self,
        kind: str,
        data: dict[str, Any] | None = None,
        *,
        step_id: str | None = None,
        attempt: int | None = None,
    ) -> NewEvent: ...


def recovery(
    writer: Writes, state: RunState, worker_id: str, epoch: int, max_recoveries: int
) -> tuple[NewEvent, RunUpdate | None]:
    """How a re-drive after a crash or a lost executor opens: ``run_recovered``, or, for a
    run that keeps killing its executors, ``run_failed`` with ``recovery_exhausted`` (it must
    not take the fleet down forever)."""
    if state.recoveries >= max_recoveries:
        error = ev.run_error(
            ev.E_RECOVERY_EXHAUSTED,
            f"the run was recovered {state.recoveries} times; giving up",
            recoveries=state.recoveries,
        )
        return writer.event(ev.RUN_FAILED, {"error": error}), RunUpdate("failed", error=error)
    recovered = {
        "fromWorker": state.worker,
        "toWorker": worker_id,
        "epoch": epoch,
        "attempt": state.recoveries + 1,
        "replayed": sorted(state.outputs),
        "inFlight": state.in_flight,
    }
    return writer.event(ev.RUN_RECOVERED, recovered), None
