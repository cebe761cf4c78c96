"""The terminal waterfall: a row per step, computed from the journal alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from lantern.store.records import Event, Run, RunStatus
from lantern.waterfall import StepRow, render, step_rows

T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)


class Journal:
    """Builds a run's events by hand, numbering them and timing them in milliseconds."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def add(
        self,
        ms: int,
        kind: str,
        data: dict[str, Any] | None = None,
        step: str | None = None,
        attempt: int | None = None,
    ) -> Journal:
        self.events.append(
            Event(
                run_id="run_1",
                seq=len(self.events) + 1,
                kind=kind,
                at=T0 + timedelta(milliseconds=ms),
                data=data or {},
                step_id=step,
                node_id=step,
                attempt=attempt,
            )
        )
        return self

    def started(self, ms: int, step: str, type: str = "tool", attempt: int = 1) -> Journal:
        return self.add(ms, "step_started", {"type": type}, step, attempt)

    def completed(self, ms: int, step: str, attempt: int = 1) -> Journal:
        return self.add(ms, "step_completed", {"output": {"step": step}}, step, attempt)


def crashed_and_recovered() -> list[Event]:
    """s1 completes, the worker dies with s2 in flight, another worker re-runs s2."""
    return (
        Journal()
        .add(0, "run_started", {"worker": "w1", "epoch": 1})
        .started(0, "start", type="trigger")
        .completed(0, "start")
        .started(0, "s1", type="connector")
        .completed(120, "s1")
        .started(120, "s2", type="tool")
        .add(
            5000,
            "run_recovered",
            {
                "fromWorker": "w1",
                "toWorker": "w2",
                "epoch": 2,
                "replayed": ["start", "s1"],
                "inFlight": ["s2"],
            },
        )
        .completed(5300, "s2")
        .started(5300, "s3", type="connector")
        .completed(5450, "s3")
        .add(5450, "run_succeeded", {"output": {"step": "s3"}})
        .events
    )


def test_rows_after_a_crash_and_recovery() -> None:
    rows = step_rows(crashed_and_recovered())
    assert rows == [
        StepRow("start", "trigger", 0.0, 0.0, "completed", 1, replayed=True),
        StepRow("s1", "connector", 0.0, 0.12, "completed", 1, replayed=True),
        StepRow("s2", "tool", 0.12, 5.18, "completed", 1, replayed=False, rerun=True),
        StepRow("s3", "connector", 5.3, 0.15, "completed", 1, replayed=False),
    ]


def test_offsets_and_durations_are_exact_seconds() -> None:
    rows = {r.step_id: r for r in step_rows(crashed_and_recovered())}
    assert rows["s2"].start == pytest.approx(0.12)
    assert rows["s2"].duration == pytest.approx(5.18)
    assert rows["s3"].start == pytest.approx(5.3)
    assert rows["s3"].duration == pytest.approx(0.15)


def test_a_step_in_flight_has_no_duration() -> None:
    events = (
        Journal()
        .add(0, "run_started")
        .started(0, "start", type="trigger")
        .completed(0, "start")
        .started(10, "s1", type="connector", attempt=2)
        .events
    )
    [_, row] = step_rows(events)
    assert row.step_id == "s1"
    assert row.status == "in flight"
    assert row.duration is None
    assert row.start == pytest.approx(0.01)
    assert row.attempt == 2
    assert row.replayed is False


def test_a_failed_step() -> None:
    events = (
        Journal()
        .add(0, "run_started")
        .started(0, "start", type="trigger")
        .completed(0, "start")
        .started(0, "boom")
        .add(40, "step_failed", {"error": {"message": "no"}}, "boom", 1)
        .add(40, "run_failed")
        .events
    )
    row = step_rows(events)[1]
    assert (row.step_id, row.status) == ("boom", "failed")
    assert row.duration == pytest.approx(0.04)


def test_parallel_steps_keep_the_order_they_started_in() -> None:
    events = (
        Journal()
        .add(0, "run_started")
        .started(0, "start", type="trigger")
        .completed(0, "start")
        .started(1, "b")
        .started(1, "a")
        .completed(30, "a")
        .completed(50, "b")
        .events
    )
    rows = step_rows(events)
    assert [r.step_id for r in rows] == ["start", "b", "a"]
    assert [r.duration for r in rows] == [0.0, pytest.approx(0.049), pytest.approx(0.029)]


def test_no_events_no_rows() -> None:
    assert step_rows([]) == []


def test_render_prints_a_row_per_step_and_the_recovery() -> None:
    events = crashed_and_recovered()
    run = Run(
        id="run_1",
        workspace="default",
        agent_name="onboard",
        agent_version=3,
        status="succeeded",
        input={},
        output={"step": "s3"},
        error=None,
        created_at=T0,
        updated_at=T0 + timedelta(seconds=6),
    )
    out: list[str] = []
    render(run, events, out.append)
    text = "\n".join(out)
    assert "run_1" in text and "onboard v3" in text and "succeeded" in text
    assert "1 recovery" in text
    lines = text.splitlines()
    for step in ("start", "s1", "s2", "s3"):
        assert any(line.split()[:1] == [step] for line in lines), (step, text)
    s2 = next(line for line in lines if line.startswith("s2 "))
    assert "+120ms" in s2 and "5180ms" in s2 and "replayed" not in s2
    s1 = next(line for line in lines if line.startswith("s1 "))
    assert "replayed" in s1
    assert "w1 -> w2" in text and "re-ran s2" in text and "replayed 2 step(s)" in text


def test_each_attempt_of_a_retried_step_has_its_own_row() -> None:
    j = Journal()
    j.add(0, "run_started").add(0, "step_started", {"type": "trigger"}, "start", 1)
    j.add(0, "step_completed", {"output": {}}, "start", 1)
    j.add(10, "step_started", {"type": "connector"}, "call", 1)
    j.add(30, "step_retrying", {"attempt": 2, "of": 3, "error": {}}, "call", 2)
    j.add(130, "step_started", {"type": "connector"}, "call", 2)
    j.add(150, "step_completed", {"output": {}}, "call", 2)
    rows = [(r.step_id, r.attempt, r.status, r.duration) for r in step_rows(j.events)]
    assert rows == [
        ("start", 1, "completed", 0.0),
        ("call", 1, "retried", 0.02),
        ("call", 2, "completed", 0.02),
    ]


def test_a_step_parked_at_an_approval_reads_waiting_until_it_completes() -> None:
    j = Journal()
    j.add(0, "run_started").add(0, "step_started", {"type": "trigger"}, "start", 1)
    j.add(0, "step_completed", {"output": {}}, "start", 1)
    j.add(5, "step_started", {"type": "approval"}, "ok", 1)
    j.add(6, "step_waiting", {"kind": "approval", "prompt": "Go?"}, "ok", 1)
    assert [(r.step_id, r.status) for r in step_rows(j.events)][-1] == ("ok", "waiting")
    j.add(9000, "step_resumed", {"decision": "approved"}, "ok", 1)
    j.add(9000, "step_completed", {"output": {"decision": "approved"}}, "ok", 1)
    row = step_rows(j.events)[-1]
    assert (row.status, row.duration) == ("completed", 8.995)


def cancelled_run(status: RunStatus = "cancelled") -> Run:
    return Run(
        id="run_1",
        workspace="default",
        agent_name="review",
        agent_version=1,
        status=status,
        input={},
        output=None,
        error=None,
        created_at=T0,
        updated_at=T0,
    )


def test_a_step_open_when_the_run_was_cancelled_reads_stopped() -> None:
    j = Journal()
    j.add(0, "run_started").started(0, "start", type="trigger").completed(0, "start")
    j.started(5, "slow")
    assert step_rows(j.events)[-1].status == "in flight"
    j.add(2000, "run_cancelled", {"reason": "api"})
    assert step_rows(j.events)[-1].status == "stopped"
    out: list[str] = []
    render(cancelled_run(), j.events, out.append)
    slow = next(line for line in out if line.startswith("slow "))
    assert "stopped" in slow and "in flight" not in slow


@pytest.mark.parametrize(
    "resumed, words",
    [
        (
            {
                "decision": "approved",
                "by": "key:1a2b3c4d5e6f",
                "approver": {"keyId": "1a2b3c4d5e6f", "keyName": "alice"},
                "comment": "looks fine",
            },
            "ok: approved by alice (key 1a2b3c4d5e6f): looks fine",
        ),
        (
            {"decision": "rejected", "by": "key:9f8e", "approver": {"keyId": "9f8e"}},
            "ok: rejected by key 9f8e",
        ),
        ({"decision": "approved", "by": "cli:ada", "comment": None}, "ok: approved by cli:ada"),
    ],
)
def test_the_waterfall_says_who_decided_an_approval(resumed: dict[str, Any], words: str) -> None:
    j = Journal()
    j.add(0, "run_started").started(0, "start", type="trigger").completed(0, "start")
    j.add(5, "step_started", {"type": "approval"}, "ok", 1)
    j.add(6, "step_waiting", {"kind": "approval", "prompt": "Go?"}, "ok", 1)
    j.add(900, "step_resumed", resumed, "ok", 1)
    j.add(900, "step_completed", {"output": resumed}, "ok", 1)
    out: list[str] = []
    render(cancelled_run("succeeded"), j.events, out.append)
    assert words in [line.strip() for line in out], out
