"""The step ledger decides, without I/O: replay, retry with a due time, failure, waits, ends.

What a graph, a plain agent, a code-first function and a microVM workload all get from it
(each kind's drive asks the same ledger), so these cases hold for every kind of run; the
crash tests (tests/crash/test_drive_parity.py) check the same facts end to end.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

import pytest

from lantern.engine import events as ev
from lantern.engine.anomalies import Anomaly
from lantern.engine.journal import fold
from lantern.engine.ledger import (
    Attempt,
    Completed,
    Due,
    Failed,
    Ledger,
    Nondeterminism,
    Parked,
    Raise,
    Replay,
    Retry,
    no_usage,
    step_error,
)
from lantern.engine.retries import RetryPolicy
from lantern.errors import StepError
from lantern.ids import child_run_id, idempotency_key
from lantern.store.records import Event, NewEvent
from lantern.store.signals import Signal

RUN = "run_1"
RETRY3 = RetryPolicy(3, 100, frozenset({"any"}))


def journaled(events: list[NewEvent]) -> list[Event]:
    """``events`` as a re-drive reads them back (with blobs)."""
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


def test_a_new_step_runs_attempt_one_with_its_key_after_its_start() -> None:
    ledger = Ledger(RUN)
    entry = ledger.enter("fetch", 1)
    assert entry == Attempt("fetch", 1, idempotency_key(RUN, "fetch", 1), start=True)
    started = ledger.start("fetch", 1, {"type": "step"})
    assert (started.kind, started.attempt, started.seq) == (ev.STEP_STARTED, 1, 1)
    # Started and not finished: a re-drive runs the same attempt again, with the same key.
    again = Ledger.fold(RUN, journaled([started]))
    assert again.enter("fetch", 1) == Attempt("fetch", 1, entry.key, start=False)


def test_a_completed_step_replays_its_output_as_the_journal_stores_it() -> None:
    ledger = Ledger(RUN)
    events = [ledger.start("fetch", 1)]
    out = ledger.exit("fetch", 1, {"n": 1, "t": (1, 2)}, RetryPolicy())
    assert out.next == Completed({"n": 1, "t": [1, 2]})  # a tuple comes back a list
    events += out.events
    assert Ledger.fold(RUN, journaled(events)).enter("fetch", 1) == Replay(
        "fetch", {"n": 1, "t": [1, 2]}
    )


def test_a_retry_is_journaled_with_its_due_time_and_survives_a_crash() -> None:
    ledger = Ledger(RUN)
    events = [ledger.start("fetch", 1)]
    boom = StepError("reset", error_class="connector", retryable=True)
    out = ledger.exit("fetch", 1, boom, RETRY3, now_ms=1_000_000)
    assert isinstance(out.next, Retry) and out.next.attempt == 2
    (retrying,) = out.events
    assert retrying.kind == ev.STEP_RETRYING and retrying.attempt == 2
    assert retrying.data["dueAt"] == out.next.due_ms == 1_000_000 + retrying.data["delayMs"]
    assert 50 <= retrying.data["delayMs"] <= 100
    assert retrying.data["of"] == 3 and retrying.data["error"]["message"] == "reset"
    events += out.events
    # After a crash: the backoff is waited out until the journaled due time.
    folded = Ledger.fold(RUN, journaled(events))
    key2 = idempotency_key(RUN, "fetch", 2)
    assert folded.enter("fetch", 1) == Due("fetch", 2, key2, out.next.due_ms)
    events.append(folded.start("fetch", 2))
    assert folded.enter("fetch", 1) == Attempt("fetch", 2, key2, start=False)


def test_the_policy_giving_up_fails_the_step_and_a_replay_raises_the_same_error() -> None:
    ledger = Ledger(RUN)
    events = [ledger.start("fetch", 1)]
    boom = StepError("bad request", error_class="connector", retryable=False)
    out = ledger.exit("fetch", 1, boom, RETRY3)
    assert out.next == Failed("fetch", boom)
    assert [e.kind for e in out.events] == [ev.STEP_FAILED]
    events += out.events
    _, update = ledger.step_ended_run("fetch", boom)
    assert update.status == "failed" and update.error is not None
    assert update.error["code"] == ev.E_STEP_FAILED and update.error["step"] == "fetch"
    entry = Ledger.fold(RUN, journaled(events)).enter("fetch", 1)
    assert entry == Raise("fetch", boom.to_json())


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"big": 2**60}, "cannot store"),
        ({"f": object()}, "not JSON"),
        ("x", None),
    ],
)
def test_an_output_the_journal_cannot_store_fails_the_step(value: Any, problem: str | None) -> None:
    ledger = Ledger(RUN)
    ledger.start("s", 1)
    out = ledger.exit("s", 1, value, RetryPolicy())
    if problem is None:
        assert out.next == Completed("x")
        return
    assert isinstance(out.next, Failed) and problem in str(out.next.error)
    assert out.next.error.retryable is False
    assert out.events[0].kind == ev.STEP_FAILED


def test_an_output_nested_too_deep_fails_the_step_rather_than_recursing() -> None:
    deep: Any = "x"
    for _ in range(200):
        deep = [deep]
    ledger = Ledger(RUN)
    ledger.start("s", 1)
    out = ledger.exit("s", 1, deep, RETRY3)
    assert isinstance(out.next, Failed) and "deep" in str(out.next.error)


def test_a_large_output_goes_to_a_blob_and_folds_back_to_the_same_value() -> None:
    ledger = Ledger(RUN)
    events = [ledger.start("s", 1)]
    value = {"text": "y" * 40_000}
    out = ledger.exit("s", 1, value, RetryPolicy())
    (completed,) = out.events
    assert completed.blob is not None and "outputRef" in completed.data
    assert ledger.outputs["s"] == value
    events += out.events
    folded = Ledger.fold(RUN, journaled(events))
    assert folded.outputs == ledger.outputs
    body = completed.blob.body
    assert completed.data["outputRef"] == "sha256:" + hashlib.sha256(body).hexdigest()


def test_a_call_at_another_position_than_the_journal_is_nondeterminism() -> None:
    ledger = Ledger(RUN)
    ledger.start("plan", 1)
    ledger.start("fetch", 1)
    folded = Ledger.fold(RUN, journaled([]))
    assert folded.enter("fetch", 1) == Attempt("fetch", 1, ledger.key("fetch", 1), start=True)
    entry = ledger.enter("fetch", 1)
    assert isinstance(entry, Nondeterminism)
    error = entry.mismatch.error()
    assert (error["code"], error["journaled"], error["requested"]) == (
        "nondeterminism",
        "plan",
        "fetch",
    )
    assert ledger.enter("fetch", 2) == Attempt("fetch", 1, ledger.key("fetch", 1), start=False)
    # Graph and plain-agent steps give no position: the kind of run plans them.
    assert isinstance(ledger.enter("fetch"), Attempt)


def test_a_wait_parks_then_resumes_with_its_outcome() -> None:
    ledger = Ledger(RUN)
    events = [ledger.start("ok", 1, {"type": "approval"})]
    events.append(ledger.wait("ok", 1, {"kind": "approval", "prompt": "go?"}))
    folded = Ledger.fold(RUN, journaled(events))
    assert folded.enter("ok") == Parked("ok", 1, {"kind": "approval", "prompt": "go?"})
    answer = {"decision": "approved", "by": "alice", "comment": None}
    out = folded.resumed("ok", answer, answer)
    assert [e.kind for e in out.events] == [ev.STEP_RESUMED, ev.STEP_COMPLETED]
    assert out.next == Completed(answer)
    child = StepError("sub-agent run x failed", error_class="tool")
    ledger.start("kid", 1, {"type": "subagent"})
    ledger.wait("kid", 1, {"kind": "subagent", "childRunId": ledger.child_id("kid", 1)})
    failed = ledger.resumed("kid", {"status": "failed"}, child)
    assert failed.next == Failed("kid", child)
    assert ledger.enter("kid") == Raise("kid", child.to_json())


def signal(n: int, name: str = "pay") -> Signal:
    return Signal(f"sig_{n}", RUN, name, {"n": n}, datetime.now(UTC))


def test_signal_waits_take_untaken_signals_one_each_in_arrival_order_or_time_out() -> None:
    ledger = Ledger(RUN)
    events: list[NewEvent] = []
    waits: list[tuple[str, dict[str, Any]]] = [
        ("a", {"kind": "signal", "name": "pay"}),
        ("b", {"kind": "signal", "name": "pay", "dueAt": 1000}),
        ("node", {"kind": "signal", "name": "pay", "dueAt": 1000, "envelope": True}),
        ("other", {"kind": "signal", "name": "ship", "dueAt": 1000}),
    ]
    for step, data in waits:
        events += [ledger.start(step, 1, {"type": "signal"}), ledger.wait(step, 1, data)]
    sent = [signal(1), signal(2), signal(3, "ship")]
    # Resolved from one look: the waits in the order they began take the signals in order.
    took = ledger.signal("a", sent, 0)
    assert took == ({"signalId": "sig_1", "name": "pay"}, {"n": 1})
    assert ledger.signal("b", sent, 0) == ({"signalId": "sig_2", "name": "pay"}, {"n": 2})
    assert ledger.signal("node", sent, 999) is None  # none left for it, not due yet
    out = ledger.resumed("a", *took)
    events += out.events
    assert [e.kind for e in out.events] == [
        ev.SIGNAL_RECEIVED, ev.STEP_RESUMED, ev.STEP_COMPLETED,
    ]  # fmt: skip
    assert out.events[0].data == {"signalId": "sig_1", "name": "pay"}
    # Folded from the journal, sig_1 is taken: b is now the first wait and takes sig_2.
    folded = Ledger.fold(RUN, journaled(events))
    assert folded.taken == {"sig_1"}
    assert folded.enter("a") == Replay("a", {"n": 1})
    assert folded.signal("b", sent, 0) == ({"signalId": "sig_2", "name": "pay"}, {"n": 2})
    timed_out = {"name": "pay", "timedOut": True, "dueAt": 1000}
    assert folded.signal("node", sent, 1000) == (timed_out, {"received": False})
    assert folded.signal("other", sent, 0) == ({"signalId": "sig_3", "name": "ship"}, {"n": 3})
    # A graph node's output is the envelope; it is the second pay wait, so the second untaken.
    assert folded.signal("node", [*sent, signal(4)], 0) == (
        {"signalId": "sig_4", "name": "pay"},
        {"received": True, "payload": {"n": 4}},
    )


def test_child_run_ids_are_a_function_of_run_step_and_attempt() -> None:
    ledger = Ledger(RUN)
    assert ledger.child_id("kid", 2) == child_run_id(RUN, "kid", 2)
    assert ledger.child_id("kid", 1) != ledger.child_id("kid", 2)


def test_anomaly_policies_record_fail_or_pause() -> None:
    ledger = Ledger(RUN)
    found = [
        Anomaly("runaway_loop", {"step": "s"}, "record"),
        Anomaly("excessive_steps", {"steps": 9}, "pause"),
    ]
    events, error, paused = ledger.anomalies(found, can_pause=True)
    assert [e.kind for e in events] == [ev.ANOMALY_DETECTED] * 2 + [ev.STEP_WAITING]
    assert error is None and paused
    assert "anomaly:excessive_steps" in ledger.waiting
    # Where the kind of run cannot park, a pause is recorded, not applied.
    other = Ledger(RUN)
    events, error, paused = other.anomalies(found[1:], can_pause=False)
    assert [e.data["policy"] for e in events] == ["record"] and not paused
    failing = Ledger(RUN)
    events, error, paused = failing.anomalies(
        [Anomaly("retry_storm", {"retries": 30}, "fail")], can_pause=True
    )
    assert error is not None and error["code"] == ev.E_ANOMALY and not paused


def test_step_error_maps_what_a_step_raised() -> None:
    own = StepError("mine", error_class="llm", retryable=False)
    assert step_error(own) is own
    mapped = step_error(ValueError("bad\nvalue"))
    assert (str(mapped), mapped.error_class, mapped.retryable) == (
        "ValueError: bad value",
        "tool",
        True,
    )


def test_the_spend_is_folded_from_usage_and_an_output_past_the_limit_fails_the_step() -> None:
    """What the budget gate of every kind of run reads (``Ledger.spent``) is the usage that
    model calls' completions carry, inline even when the output went to a blob, and folds
    back from the journal; the output limit is the ledger's (read once with the settings)."""
    ledger = Ledger(RUN, max_output=100_000)
    events: list[NewEvent] = []

    def usage(output: Any) -> dict[str, Any]:
        return {"inputTokens": 10, "outputTokens": output["n"], "costUsd": 0.5}

    for step, n, size in (("m1", 5, 10), ("m2", 7, 40_000), ("t", 0, 10)):
        events.append(ledger.start(step, 1, {"type": "llm" if step != "t" else "tool"}))
        how = usage if step != "t" else no_usage
        done = ledger.exit(step, 1, {"n": n, "text": "x" * size}, RETRY3, usage=how)
        events += done.events
    assert any(e.blob is not None for e in events)  # m2's output is a blob
    assert (ledger.spent.tokens, ledger.spent.cost_usd, ledger.spent.model_calls) == (32, 1.0, 2)
    assert Ledger.fold(RUN, journaled(events)).spent == ledger.spent
    small = Ledger(RUN, max_output=50)
    small.start("big", 1)
    done = small.exit("big", 1, {"text": "x" * 60}, RETRY3)
    assert isinstance(done.next, Failed) and "limit of 50 bytes" in str(done.next.error)
    assert small.spent.model_calls == 0


def test_the_run_end_events() -> None:
    ledger = Ledger(RUN)
    event, update = ledger.cancelled(["b", "a"])
    assert event.data == {"by": "request", "uninterruptible": ["a", "b"]}
    assert update.status == "cancelled"
    assert ledger.state.terminal == ev.RUN_CANCELLED
    event, update = Ledger(RUN).succeeded({"ok": True})
    assert (event.kind, update.status, update.output) == (
        ev.RUN_SUCCEEDED,
        "succeeded",
        {"ok": True},
    )


def _old(kind: str, data: dict[str, Any], step: str, attempt: int, seq: int) -> Event:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return Event(RUN, seq, kind, at, data, step, step, attempt)


def test_an_old_retry_without_due_time_folds_and_is_due_at_once() -> None:
    """A microVM harness once reported step_retrying {attempt, of, error} only: the journal
    must still fold (it used to raise KeyError), and the retry is due at once."""
    journal = [
        _old(ev.STEP_STARTED, {"type": "step"}, "s", 1, 1),
        _old(ev.STEP_RETRYING, {"attempt": 2, "of": 3, "error": {"message": "x"}}, "s", 2, 2),
    ]
    assert fold(journal).retrying == {"s": (2, 0)}
    ledger = Ledger.fold(RUN, journal)
    assert ledger.enter("s", 1) == Due("s", 2, ledger.key("s", 2), 0)


def test_a_repin_names_the_version() -> None:
    journal = [_old(ev.RUN_REPINNED, {"from": "v1", "version": "v2", "by": "op"}, "", 1, 1)]
    journal = [Event(RUN, 1, ev.RUN_REPINNED, journal[0].at, journal[0].data, None, None, None)]
    assert Ledger.fold(RUN, journal).pinned == "v2"
