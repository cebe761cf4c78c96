"""A model call a rate limit holds back is a ledger wait with a due time, not a spent attempt
(docs/rate-limits.md): the same for every kind of run, since every drive asks this ledger.
A provider's Retry-After is a floor under a retry's backoff."""

from __future__ import annotations

from lantern.engine import events as ev
from lantern.engine.ledger import PARK_MS, Attempt, Completed, Due, Ledger, Retry
from lantern.engine.retries import RetryPolicy
from lantern.errors import StepError, Throttled
from lantern.models.errors import retry_after_ms, status_error
from tests.unit.test_ledger import RETRY3, journaled

RUN = "run_1"


def test_a_throttled_attempt_waits_and_runs_again_with_its_own_key() -> None:
    book = Ledger(RUN)
    book.event(ev.RUN_STARTED)
    first = book.start("m", 1, {"type": "llm"})
    done = book.exit("m", 1, Throttled("openai-tpm", 1500), RETRY3, now_ms=10_000)
    assert [e.kind for e in done.events] == [ev.STEP_THROTTLED]
    assert done.events[0].data == {"limit": "openai-tpm", "waitMs": 1500, "dueAt": 11_500}
    assert done.events[0].attempt == 1
    assert done.next == Retry("m", 1, 11_500)
    # A re-drive (after a crash, on another replica) finds the same wait.
    again = Ledger.fold(RUN, journaled([*[first], *done.events]))
    assert again.enter("m") == Due("m", 1, book.key("m", 1), 11_500)
    assert again.state.backing_off == {"m": (1, 11_500)} and again.state.in_flight == []
    # Waited out, the same attempt starts again: throttling spends none of maxAttempts.
    book.start("m", 1, {"type": "llm"})
    assert book.enter("m") == Attempt("m", 1, book.key("m", 1), start=False)
    for _ in range(5):
        book.exit("m", 1, Throttled("openai-tpm", 10), RETRY3, now_ms=20_000)
        book.start("m", 1, {"type": "llm"})
    failed = book.exit("m", 1, StepError("503", error_class="llm", retryable=True), RETRY3)
    assert isinstance(failed.next, Retry) and failed.next.attempt == 2
    finished = book.exit("m", 2, {"text": "ok"}, RETRY3)
    assert isinstance(finished.next, Completed)


def test_a_retry_after_is_a_floor_under_the_backoff() -> None:
    book = Ledger(RUN)
    book.start("m", 1, {"type": "llm"})
    error = status_error("openai", "gpt", 429, "slow down", {"retry-after": "7"})
    assert error.retryable and error.retry_after_ms == 7000
    done = book.exit("m", 1, error, RetryPolicy(3, 100, frozenset({"any"})), now_ms=0)
    assert done.next == Retry("m", 2, 7000)
    assert done.events[0].data["delayMs"] == 7000
    assert retry_after_ms({"retry-after-ms": "250"}) == 250
    assert retry_after_ms({"retry-after": "soon"}) == 0
    assert retry_after_ms({"retry-after": "99999"}) == 300_000  # a retry's longest wait
    assert retry_after_ms(None) == 0


def test_a_rate_limits_wait_parks_the_run_a_retrys_backoff_does_not() -> None:
    book = Ledger(RUN)
    book.event(ev.RUN_STARTED)
    book.start("m", 1, {"type": "llm"})
    book.exit("m", 1, Throttled("openai-tpm", 5000), RETRY3, now_ms=10_000)
    assert book.parks("m", 15_000, now_ms=10_000)
    assert not book.parks("m", 15_000, now_ms=15_000 - PARK_MS + 1)  # about due: waited out
    assert book.parked_until(now_ms=10_000) == 15_000
    # A retry's backoff waits in the drive; beside a rate limit's wait, the run parks only
    # when neither is due within PARK_MS, until the first is.
    book.start("t", 1, {"type": "tool"})
    book.exit("t", 1, StepError("503", error_class="tool", retryable=True), RETRY3, now_ms=10_000)
    retry_due = book.state.backing_off["t"][1]
    assert retry_due - 10_000 < PARK_MS
    assert not book.parks("t", retry_due, now_ms=0)
    assert book.parked_until(now_ms=10_000) is None  # the retry runs first
    assert book.parked_until(now_ms=retry_due - PARK_MS) == retry_due
    book.start("t", 2, {"type": "tool"})
    assert book.parked_until(now_ms=10_000) == 15_000
    # Once the throttled attempt starts again, nothing parks the run.
    book.start("m", 1, {"type": "llm"})
    assert book.parked_until(now_ms=10_000) is None
