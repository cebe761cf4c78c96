"""The step ledger: what every kind of run decides about its steps, pure (no I/O).

A drive (graph, plain agent, code-first function, microVM) holds one ``Ledger`` per run. It
is built from one fold of the run's journal and kept current by folding every event it makes
(the same ``journal.fold_event``), so the ledger a drive holds after writing some events
equals the ledger folded from the journal those events were written to. The drive does the
I/O (the fenced commit, the lease, running the step's work, waiting); the ledger decides.

Building one::

    ledger = Ledger.fold(run_id, journal)   # a journal read with blobs (a re-drive)
    ledger = Ledger(run_id)                 # a run that has no journal yet

What it knows (read-only for callers; change it only through the methods below):
``state`` (the ``journal.RunState``: outputs, attempts, waiting, retrying, ...), and
``outputs``, ``attempts``, ``waiting`` (shortcuts into it), ``errors`` (step -> the error of
its ``step_failed``), ``types`` (step -> its ``step_started`` type), ``order`` (step ids in
the order first started), ``pinned`` (the version a ``run_repinned`` moved the run to, or
None), ``backing_off`` (step -> (next attempt, due epoch ms) of a retry not started yet),
``seq`` and ``hash`` (the chain's head), ``taken`` (the ids of the signals waits took).

A signal wait (docs/signals.md) parks like an approval (``Parked``; no lease, no slot);
``signal(step, signals, now_ms)`` decides which of the run's signals it takes, or that it
timed out, and ``resumed`` journals that with ``signal_received``.

Entering a step, ``enter(step, position=None)`` answers one of:

- ``Replay(step, output)``: it completed; return its journaled output without running it;
- ``Raise(step, error)``: it failed for good; raise its journaled error (``error`` is the
  ``step_failed`` error dict);
- ``Attempt(step, attempt, key, start)``: run attempt ``attempt`` with idempotency key
  ``key``; when ``start`` is True journal ``ledger.start(step, attempt, data)`` first (write
  ahead), when False it was in flight at a crash and runs again with the same attempt/key;
- ``Due(step, attempt, key, due_ms)``: a retry whose backoff a crash or a park cut short:
  wait until ``due_ms`` (epoch ms), then journal ``start`` and run it;
- ``Parked(step, attempt, wait)``: a wait (approval, signal, timer, sub-agent) is journaled:
  resolve it, then ``resumed(...)``;
- ``Nondeterminism(mismatch)``: ``position`` (1-based, code-first and microVM calls) asks
  for another step than the journal holds there: the run fails with ``mismatch.error()``.

Leaving a step attempt, ``exit(step, attempt, outcome, policy, usage=..., now_ms=...)``
returns ``Exit(events, next)``: the events to commit (already chained and folded into the
ledger) and what comes next, one of ``Completed(output)`` (the output exactly as a replay
reads it back), ``Retry(step, attempt, due_ms)`` (``step_retrying`` with ``dueAt``, the next
attempt's start is journaled when it is due; after ``step_throttled``, a model call a rate
limit held back, the same attempt starts again when due) or ``Failed(step, error)``
(``step_failed``; the caller ends the run, e.g. with ``step_ended_run``, or raises into a
function). ``outcome`` is the step's value or a ``StepError``; a value the journal cannot
store (not JSON, too large a number, nested past ``limits.MAX_DEPTH``) becomes a
non-retryable StepError here.
``step_error(exc)`` maps anything a step's work raised to the StepError it fails with.

Other events, each made, chained and folded in one call: ``start`` (``step_started``),
``event(kind, data, step_id=, attempt=)`` and ``completed(...)`` (the ``EventWriter``
calls, so a ledger stands where a writer did), ``wait`` (``step_waiting``), ``failed``
(``step_failed`` without a retry decision, for a wait that fails at once), ``resumed``
(``step_resumed`` and the outcome of a wait; ``resuming`` the first part alone, with
``signal_received`` before it when the wait took a signal), ``anomalies(found)``
(``anomaly_detected`` and each one's policy applied), and the run's end: ``succeeded``,
``run_failed``, ``step_ended_run``, ``cancelled`` (each ``(event, RunUpdate)``).
A rate limit's wait parks the run as a timer does (docs/rate-limits.md): ``parks(step, due_ms)``
says whether waiting for ``step`` until ``due_ms`` gives the run's lease and slot up (the run
``waiting`` with ``wake_at`` at the due time, claimed then by any replica) rather than waiting
in the drive; ``parked_until()`` is when a run that has nothing but timed waits left, one of them
a rate limit's that parks, is due again. A retry's backoff waits in the drive.
``key(step, attempt)`` and ``child_id(step, attempt)`` give an attempt's idempotency key and
its sub-agent's run id, both pure functions of (run, step, attempt), so a re-drive finds
what the crash left.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lantern import limits
from lantern.engine import determinism
from lantern.engine import events as ev
from lantern.engine.anomalies import Anomaly
from lantern.engine.journal import EventWriter, RunState, fold_event
from lantern.engine.payloads import (
    AnomalyDetected,
    RunCancelled,
    RunRepinned,
    SignalReceived,
    SignalWait,
    StepFailed,
    StepRetrying,
    StepStarted,
    StepThrottled,
)
from lantern.engine.retries import MAX_BACKOFF_MS, RetryPolicy
from lantern.errors import StepError, Throttled
from lantern.ids import child_run_id, idempotency_key
from lantern.models.budget import Budget, spent_in
from lantern.store.codec import dumps, text_problem
from lantern.store.records import Event, NewEvent, RunUpdate, RunUsage
from lantern.store.signals import Signal

Usage = Callable[[Any], dict[str, Any] | None]

# A rate limit's wait shorter than this is waited out in the drive: parking the run and
# claiming it again costs about as long (the dispatcher looks for due runs every 0.2 s).
PARK_MS = 250


def no_usage(_: Any) -> None:
    return None


# -- what enter() answers ----------------------------------------------------------------


@dataclass(frozen=True)
class Replay:
    step: str
    output: Any


@dataclass(frozen=True)
class Raise:
    step: str
    error: dict[str, Any]


@dataclass(frozen=True)
class Attempt:
    step: str
    attempt: int
    key: str
    start: bool  # journal step_started before running it (False: in flight at a crash)


@dataclass(frozen=True)
class Due:
    step: str
    attempt: int
    key: str
    due_ms: int


@dataclass(frozen=True)
class Parked:
    step: str
    attempt: int
    wait: dict[str, Any]


@dataclass(frozen=True)
class Nondeterminism:
    mismatch: determinism.Mismatch


Entry = Replay | Raise | Attempt | Due | Parked | Nondeterminism


# -- what exit() answers -----------------------------------------------------------------


@dataclass(frozen=True)
class Completed:
    output: Any


@dataclass(frozen=True)
class Retry:
    step: str
    attempt: int  # the attempt to start when due
    due_ms: int


@dataclass(frozen=True)
class Failed:
    step: str
    error: StepError


Next = Completed | Retry | Failed


@dataclass(frozen=True)
class Exit:
    events: list[NewEvent]
    next: Next


class FailedStep(StepError):
    """A step that failed for good, raised into the function: catch it to go on without it."""

    def __init__(self, step: str, error: dict[str, Any]) -> None:
        super().__init__(
            str(error.get("message", "the step failed")),
            error_class=error.get("class", "tool"),
            retryable=bool(error.get("retryable", False)),
        )
        self.step = step
        self.error = error


def step_error(exc: BaseException) -> StepError:
    """What a step attempt fails with when its work raised ``exc``, for every kind of run (a
    graph node, a plain agent's turn, a code-first or microVM step): a StepError as it is;
    anything else (the user's code, a tool raising one of Lantern's non-step errors, a bug
    in a node) is retryable, of class ``tool`` (as in Temporal), and the retry policy
    decides. A store failure is not the step's: the drive stops on it instead (``Drive``)."""
    if isinstance(exc, StepError):
        return exc
    message = " ".join(f"{type(exc).__name__}: {exc}".split())
    return StepError(message, error_class="tool", retryable=True)


def encoded(value: Any, limit: int) -> tuple[Any, str] | str:
    """``value`` as the journal stores it (and a replay reads it back) with its JSON, or
    what is wrong with it: the one check of every output a run journals (a step's, a tool
    call's, a function's return value). At most ``limit`` bytes (the ledger's
    ``max_output``: LANTERN_MAX_OUTPUT_BYTES, read once with the settings), measured before
    it is encoded so a huge output is refused at little cost; canonical JSON refuses what JSON
    cannot carry exactly (such as integers past 2^53), and deeper values would recurse through
    every later dump, copy and render."""
    try:
        if limits.size_exceeds(value, limit):
            return limits.too_large_problem(limit)
        if limits.depth_exceeds(value):
            return limits.too_deep_problem()
        body = dumps(value)
        problem = text_problem(body)
        if problem is None and len(body) > limit:
            problem = limits.too_large_problem(limit)
        if problem is None:
            return json.loads(body), body
    except (TypeError, ValueError) as err:
        problem = f"it is not JSON: {err}"
    return problem


def _unstorable(step: str, problem: str) -> StepError:
    return StepError(
        f"step {step!r} returned a value the journal cannot store: {problem}",
        error_class="tool",
    )


class Ledger:
    """One run's steps as the journal has them, and the decisions that follow from them."""

    def __init__(
        self,
        run_id: str,
        *,
        budget: Budget | None = None,
        max_output: int = limits.MAX_OUTPUT_BYTES,
    ) -> None:
        self.run_id = run_id
        self.budget = budget  # the agent's: what the run's model calls may spend (Gate)
        self.max_output = max_output  # the largest output journaled (LANTERN_MAX_OUTPUT_BYTES)
        self.spent = RunUsage()  # the journaled usage of the run's steps (model calls)
        self.state = RunState()
        self.errors: dict[str, dict[str, Any]] = {}
        self.types: dict[str, str] = {}
        self.order: list[str] = []
        self.pinned: str | None = None
        self.taken: set[str] = set()  # the ids of the signals waits have taken
        self._writer = EventWriter(run_id)

    @classmethod
    def fold(
        cls,
        run_id: str,
        events: Iterable[Event | NewEvent],
        *,
        budget: Budget | None = None,
        max_output: int = limits.MAX_OUTPUT_BYTES,
    ) -> Ledger:
        ledger = cls(run_id, budget=budget, max_output=max_output)
        for e in events:
            ledger.apply(e)
        return ledger

    def apply(self, e: Event | NewEvent) -> None:
        """Fold one journaled event in (what ``fold`` does for each event of a journal)."""
        fold_event(self.state, e)
        step = e.step_id
        if step is not None:
            if e.kind == ev.STEP_STARTED:
                if step not in self.types:
                    self.order.append(step)
                self.types[step] = StepStarted.type_of(e.data)
            elif e.kind == ev.STEP_FAILED:
                self.errors[step] = StepFailed.read(e.data).error
            elif e.kind == ev.STEP_COMPLETED and "usage" in e.data:
                # What the budget gate counts, the same for every kind of run: the usage a
                # model call's step_completed carries (inline even when its output is a blob).
                self.spent = self.spent + spent_in((e.data["usage"],))
            elif e.kind == ev.SIGNAL_RECEIVED:
                self.taken.add(SignalReceived.read(e.data).signal_id)
        elif e.kind == ev.RUN_REPINNED:
            self.pinned = RunRepinned.read(e.data).version
        self._writer.seq, self._writer.hash = self.state.last_seq, self.state.last_hash

    # -- what it knows ---------------------------------------------------------------------

    @property
    def outputs(self) -> dict[str, Any]:
        return self.state.outputs

    @property
    def attempts(self) -> dict[str, int]:
        return self.state.attempts

    @property
    def waiting(self) -> dict[str, dict[str, Any]]:
        return self.state.waiting

    @property
    def backing_off(self) -> dict[str, tuple[int, int]]:
        return self.state.backing_off

    @property
    def seq(self) -> int:
        return self.state.last_seq

    @property
    def hash(self) -> str:
        return self.state.last_hash

    def key(self, step: str, attempt: int) -> str:
        return idempotency_key(self.run_id, step, attempt)

    def child_id(self, step: str, attempt: int) -> str:
        """The run id of the sub-agent this step attempt starts: a re-drive finds it."""
        return child_run_id(self.run_id, step, attempt)

    # -- entering a step -------------------------------------------------------------------

    def enter(self, step: str, position: int | None = None) -> Entry:
        """What to do about ``step``, the ``position``-th call of a function (None: a step
        the kind of run plans itself, such as a graph node)."""
        if position is not None:
            found = determinism.mismatch(self.order, position, step)
            if found is not None:
                return Nondeterminism(found)
        state = self.state
        if step in state.outputs:
            return Replay(step, state.outputs[step])
        if step in self.errors:
            return Raise(step, self.errors[step])
        started = state.attempts.get(step)
        wait = state.waiting.get(step)
        if wait is not None:
            return Parked(step, started or 1, wait)
        throttled = state.throttled.get(step)
        if throttled is not None:  # a rate limit's wait: the same attempt, when due
            return Due(step, throttled[0], self.key(step, throttled[0]), throttled[1])
        retry = state.retrying.get(step)
        if retry is not None and retry[0] > (started or 0):
            return Due(step, retry[0], self.key(step, retry[0]), retry[1])
        if started is not None:
            return Attempt(step, started, self.key(step, started), start=False)
        return Attempt(step, 1, self.key(step, 1), start=True)

    # -- timed waits that park --------------------------------------------------------------

    def parks(self, step: str, due_ms: int, now_ms: int | None = None) -> bool:
        """Whether ``step``, waiting until ``due_ms``, parks the run: a rate limit's wait
        holds no run slot and no lease while it waits (unless it ends within ``PARK_MS``); a
        retry's backoff is waited out by the drive."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return step in self.state.throttled and due_ms - now >= PARK_MS

    def parked_until(self, now_ms: int | None = None) -> int | None:
        """For a run with nothing in flight but timed waits (retries' backoffs, rate limits'
        waits): when it is due again if it parks for them (one is a rate limit's wait that
        parks, and none is due within ``PARK_MS``), else None (its drive waits)."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if not any(self.parks(s, due, now) for s, (_, due) in self.state.throttled.items()):
            return None
        first = min(due for _, due in self.state.backing_off.values())
        return first if first - now >= PARK_MS else None

    # -- events, each chained and folded in --------------------------------------------------

    def event(
        self,
        kind: str,
        data: dict[str, Any] | None = None,
        *,
        step_id: str | None = None,
        attempt: int | None = None,
    ) -> NewEvent:
        made = self._writer.event(kind, data, step_id=step_id, attempt=attempt)
        self.apply(made)
        return made

    def completed(
        self,
        step_id: str,
        attempt: int,
        output: Any,
        encoded: str | None = None,
        *,
        usage: dict[str, Any] | None = None,
    ) -> NewEvent:
        """``step_completed`` (``EventWriter.completed``), folded in with ``output`` itself
        (not re-read from a blob)."""
        made = self._writer.completed(step_id, attempt, output, encoded, usage=usage)
        self.apply(_inline(made, output))
        return made

    def start(self, step: str, attempt: int, data: Mapping[str, Any] | None = None) -> NewEvent:
        """``step_started`` of ``(step, attempt)``: commit it before the step is invoked."""
        body = dict(data) if data is not None else {"type": self.types.get(step, "step")}
        return self.event(ev.STEP_STARTED, body, step_id=step, attempt=attempt)

    def wait(self, step: str, attempt: int, data: dict[str, Any]) -> NewEvent:
        """``step_waiting``: the step parks at an approval, a timer or a sub-agent."""
        return self.event(ev.STEP_WAITING, data, step_id=step, attempt=attempt)

    def failed(self, step: str, attempt: int, error: StepError) -> NewEvent:
        """``step_failed`` with no retry (a wait that fails at once or when it resolves)."""
        data = StepFailed(error.to_json()).data()
        return self.event(ev.STEP_FAILED, data, step_id=step, attempt=attempt)

    # -- leaving a step attempt ------------------------------------------------------------

    def exit(
        self,
        step: str,
        attempt: int,
        outcome: Any,
        policy: RetryPolicy,
        *,
        usage: Usage = no_usage,
        now_ms: int | None = None,
    ) -> Exit:
        """The events of attempt ``attempt`` of ``step`` having ended with ``outcome`` (its
        value or a StepError), and what comes next under ``policy``."""
        if not isinstance(outcome, StepError):
            found = self._complete(step, attempt, outcome, usage)
            if not isinstance(found, StepError):
                return Exit([found], Completed(self.state.outputs[step]))
            outcome = found
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if isinstance(outcome, Throttled):  # no call was made: not an attempt spent
            wait = StepThrottled(outcome.limit, outcome.wait_ms, now + outcome.wait_ms)
            event = self.event(ev.STEP_THROTTLED, wait.data(), step_id=step, attempt=attempt)
            return Exit([event], Retry(step, attempt, wait.due_at))
        if policy.retries(outcome, attempt):
            # A provider's Retry-After (a 429) is a floor under the policy's backoff.
            delay = max(policy.delay_ms(attempt), min(outcome.retry_after_ms, MAX_BACKOFF_MS))
            retry = StepRetrying(
                attempt + 1, policy.max_attempts, outcome.to_json(), delay, now + delay
            )
            event = self.event(ev.STEP_RETRYING, retry.data(), step_id=step, attempt=attempt + 1)
            return Exit([event], Retry(step, attempt + 1, retry.due_at))
        return Exit([self.failed(step, attempt, outcome)], Failed(step, outcome))

    def resumed(self, step: str, data: dict[str, Any], outcome: Any) -> Exit:
        """A resolved wait: ``step_resumed`` with ``data``, then the step's output (a
        decision, a child's output, None for a timer) or its failure (a StepError)."""
        attempt = self.state.attempts.get(step, 1)
        events = self.resuming(step, data)
        if isinstance(outcome, StepError):
            events.append(self.failed(step, attempt, outcome))
            return Exit(events, Failed(step, outcome))
        found = self._complete(step, attempt, outcome, no_usage)
        if isinstance(found, StepError):
            events.append(self.failed(step, attempt, found))
            return Exit(events, Failed(step, found))
        events.append(found)
        return Exit(events, Completed(self.state.outputs[step]))

    def resuming(self, step: str, data: dict[str, Any]) -> list[NewEvent]:
        """``step_resumed`` with ``data``, after ``signal_received`` when the wait took a
        signal (``data`` names its id): the step's outcome follows in the same commit."""
        attempt = self.state.attempts.get(step, 1)
        events: list[NewEvent] = []
        if "signalId" in data:
            got = SignalReceived(str(data["signalId"]), str(data.get("name")))
            events.append(self.event(ev.SIGNAL_RECEIVED, got.data(), step_id=step, attempt=attempt))
        events.append(self.event(ev.STEP_RESUMED, data, step_id=step, attempt=attempt))
        return events

    # -- signal waits ----------------------------------------------------------------------

    def signal(
        self, step: str, signals: Sequence[Signal], now_ms: int
    ) -> tuple[dict[str, Any], Any] | None:
        """What resolves the signal wait ``step`` parks at, given the run's ``signals`` of
        its name in arrival order: the ``step_resumed`` data and the step's output, or None
        while it waits on. The signals no wait has taken go one per wait, in arrival order,
        to the waits in the order they began (the n-th waiting takes the n-th untaken), so
        several waits resolved from one look never take the same signal; a wait that finds
        none past its ``dueAt`` times out."""
        wait = SignalWait.read(self.state.waiting.get(step, {}))
        if wait is None:
            return None
        waits = [
            s
            for s, w in self.state.waiting.items()
            if w.get("kind") == SignalWait.KIND and w.get("name") == wait.name
        ]
        rank = waits.index(step)
        untaken = [g for g in signals if g.name == wait.name and g.id not in self.taken]
        if rank < len(untaken):
            got = untaken[rank]
            return {"signalId": got.id, "name": wait.name}, wait.output(got.payload, True)
        if wait.due_at is not None and now_ms >= wait.due_at:
            return {"name": wait.name, "timedOut": True, "dueAt": wait.due_at}, wait.output(
                None, False
            )
        return None

    def _complete(self, step: str, attempt: int, value: Any, usage: Usage) -> NewEvent | StepError:
        """``step_completed`` with ``value`` as a replay reads it back, or the StepError
        saying why the journal cannot store it (``encoded``; the hash chain's canonical
        JSON refuses what JSON cannot carry exactly, and leaves the chain as it was)."""
        found = encoded(value, self.max_output)
        if isinstance(found, str):
            return _unstorable(step, found)
        output, body = found
        try:
            return self.completed(step, attempt, output, body, usage=usage(output))
        except (TypeError, ValueError) as err:
            return _unstorable(step, f"it is not JSON: {err}")

    # -- anomalies -------------------------------------------------------------------------

    def anomalies(
        self, found: Sequence[Anomaly], *, can_pause: bool
    ) -> tuple[list[NewEvent], dict[str, Any] | None, bool]:
        """``anomaly_detected`` for each anomaly found, each policy applied: the events, the
        run's error when one fails it, and whether one paused it (an implicit approval step
        ``anomaly:<kind>``; recorded only where the kind of run cannot park)."""
        events: list[NewEvent] = []
        error: dict[str, Any] | None = None
        paused = False
        for a in found:
            policy = a.policy if can_pause or a.policy == "fail" else "record"
            anomaly = AnomalyDetected(a.kind, a.detail, policy)
            events.append(self.event(ev.ANOMALY_DETECTED, anomaly.data()))
            if policy == "fail" and error is None:
                error = ev.anomaly_error(a.kind, a.detail)
            elif policy == "pause":
                paused = True
                wait = {
                    "kind": "approval",
                    "anomaly": a.kind,
                    "prompt": f"Anomaly {a.kind}: {a.detail}. Let the run go on?",
                }
                events.append(self.wait(f"anomaly:{a.kind}", 1, wait))
        return events, error, paused and error is None

    # -- the run's end ---------------------------------------------------------------------

    def succeeded(self, output: Any) -> tuple[NewEvent, RunUpdate]:
        event = self.event(ev.RUN_SUCCEEDED, {"output": output})
        return event, RunUpdate("succeeded", output=output)

    def run_failed(self, error: dict[str, Any]) -> tuple[NewEvent, RunUpdate]:
        return self.event(ev.RUN_FAILED, {"error": error}), RunUpdate("failed", error=error)

    def step_ended_run(self, step: str, error: StepError) -> tuple[NewEvent, RunUpdate]:
        """The run fails because ``step`` failed for good."""
        return self.run_failed(ev.step_failed_error(step, error.to_json()))

    def cancelled(self, uninterruptible: Sequence[str] = ()) -> tuple[NewEvent, RunUpdate]:
        """``run_cancelled``; ``uninterruptible`` names the steps (sync tools in threads)
        the cancellation had to wait for."""
        data = RunCancelled("request", tuple(uninterruptible)).data()
        return self.event(ev.RUN_CANCELLED, data), RunUpdate("cancelled", error=ev.CANCELLED)


def _inline(event: NewEvent, output: Any) -> NewEvent:
    """``event`` as the fold should read it: the output inline even when it went to a blob."""
    if event.blob is None:
        return event
    usage = event.data.get("usage")
    return NewEvent(
        seq=event.seq,
        kind=event.kind,
        at=event.at,
        data={"output": output} if usage is None else {"output": output, "usage": usage},
        step_id=event.step_id,
        attempt=event.attempt,
        hash=event.hash,
    )
