"""Step ids of a code-first run and the nondeterminism check, without any I/O."""

from __future__ import annotations

import pytest

from lantern.engine.determinism import StepNames, check_name, mismatch, unfinished
from lantern.errors import UsageError


def test_repeated_names_are_numbered_in_call_order() -> None:
    names = StepNames()
    ids = [names.next(n) for n in ["fetch", "plan", "fetch", "fetch", "plan"]]
    assert ids == ["fetch", "plan", "fetch#2", "fetch#3", "plan#2"]
    assert names.order == ids and names.position == 5


def test_the_same_calls_give_the_same_ids() -> None:
    calls = ["a", "b", "a", "c", "a"]
    first, second = StepNames(), StepNames()
    assert [first.next(c) for c in calls] == [second.next(c) for c in calls]


def test_a_matching_replay_passes_and_new_calls_beyond_the_journal_pass() -> None:
    journal = ["fetch", "plan", "fetch#2"]
    assert all(mismatch(journal, i, s) is None for i, s in enumerate(journal, start=1))
    assert mismatch(journal, 4, "publish") is None


def test_a_different_name_names_position_journaled_and_requested() -> None:
    found = mismatch(["fetch", "plan"], 2, "summarise")
    assert found is not None
    error = found.error()
    assert error["code"] == "nondeterminism"
    assert (error["position"], error["journaled"], error["requested"]) == (2, "plan", "summarise")
    assert "'plan'" in error["message"] and "'summarise'" in error["message"]
    assert "step 2" in error["message"]


def test_returning_before_the_journal_ends_is_a_mismatch() -> None:
    assert unfinished(["a", "b"], 2) is None
    found = unfinished(["a", "b", "c"], 2)
    assert found is not None and (found.position, found.journaled) == (3, "c")
    assert "returned" in found.requested


@pytest.mark.parametrize(
    ("name", "says"),
    [
        (3, "must be a string, not int"),
        (None, "must be a string, not NoneType"),
        ("", "1-200 characters"),
        ("x" * 201, "1-200 characters"),
        ("a#2", "may not contain '#'"),
        ("a\nb", "control characters"),
    ],
)
def test_bad_step_names_get_one_clear_line(name: object, says: str) -> None:
    with pytest.raises(UsageError, match=says) as info:
        check_name(name, "ctx.step")
    assert "\n" not in str(info.value).replace("'a\\nb'", "")
    assert str(info.value).startswith("ctx.step")


def test_good_names_pass_as_they_are() -> None:
    assert check_name("fetch pages (1/2) — ünïcode", "ctx.step") == "fetch pages (1/2) — ünïcode"
