"""Any interleaving of step outcomes, decided by the ledger, folds back to the same ledger.

A drive keeps its ledger current by folding each event it makes; a re-drive folds the
journal those events were written to. The two must agree, whatever happened: completions,
retries, failures, waits, outputs stored as blobs, anomalies, the run's end.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lantern.engine.anomalies import Anomaly
from lantern.engine.ledger import Attempt, Completed, Due, Failed, Ledger, Parked, Retry
from lantern.engine.retries import RetryPolicy
from lantern.errors import StepError
from lantern.store.records import Event, NewEvent

RUN = "run_p"

outcomes = st.one_of(
    st.just("ok"),
    st.just("big"),
    st.just("transient"),
    st.just("fatal"),
    st.just("unstorable"),
    st.just("wait"),
    st.just("anomaly"),
)
plans = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.lists(outcomes, min_size=1, max_size=4)),
    min_size=1,
    max_size=8,
)


def read_back(events: list[NewEvent]) -> list[Event]:
    return [
        Event(
            RUN,
            e.seq,
            e.kind,
            e.at,
            e.data,
            e.step_id,
            e.node_id,
            e.attempt,
            blob_digest=None if e.blob is None else e.blob.digest,
            blob=None if e.blob is None else e.blob.body,
            hash=e.hash,
        )
        for e in events
    ]


def snapshot(ledger: Ledger) -> tuple[Any, ...]:
    s = ledger.state
    return (
        s.started,
        s.terminal,
        s.last_seq,
        s.last_hash,
        s.outputs,
        s.attempts,
        s.failed,
        s.retrying,
        s.waiting,
        ledger.errors,
        ledger.types,
        ledger.order,
        ledger.backing_off,
    )


def value(outcome: str, step: str) -> Any:
    if outcome == "ok":
        return {"step": step, "n": [1, 2.5, None]}
    if outcome == "big":
        return {"blob": step * 20_000}
    if outcome == "unstorable":
        return {"n": 2**60}
    if outcome == "transient":
        return StepError("reset", error_class="connector", retryable=True)
    return StepError("no", error_class="tool", retryable=False)


@settings(max_examples=60, deadline=None)
@given(plans, st.integers(min_value=1, max_value=4), st.booleans())
def test_the_ledger_a_drive_holds_is_the_ledger_its_journal_folds_to(
    plan: list[tuple[str, list[str]]], max_attempts: int, end: bool
) -> None:
    policy = RetryPolicy(max_attempts, 10, frozenset({"any"}))
    ledger = Ledger(RUN)
    events: list[NewEvent] = []
    position = 0
    for name, tries in plan:
        position += 1
        for outcome in tries:
            entry = ledger.enter(name)
            if not isinstance(entry, Attempt | Due | Parked):
                break  # replayed or raised: nothing more happens to this step
            if isinstance(entry, Parked):
                answer = {"decision": "approved"}
                events += ledger.resumed(name, answer, answer).events
                break
            if isinstance(entry, Due) or entry.start:
                events.append(ledger.start(name, entry.attempt, {"type": "step"}))
            if outcome == "wait":
                events.append(ledger.wait(name, entry.attempt, {"kind": "timer", "dueAt": 5}))
                break
            if outcome == "anomaly":
                found = [Anomaly("runaway_loop", {"step": name}, "pause")]
                events += ledger.anomalies(found, can_pause=True)[0]
                continue
            out = ledger.exit(name, entry.attempt, value(outcome, name), policy, now_ms=10**12)
            events += out.events
            assert isinstance(out.next, Completed | Retry | Failed)
            # Folding what was written so far always gives back what the drive holds.
            assert snapshot(Ledger.fold(RUN, read_back(events))) == snapshot(ledger)
    if end:
        events.append(ledger.succeeded({"done": True})[0])
    assert snapshot(Ledger.fold(RUN, read_back(events))) == snapshot(ledger)
