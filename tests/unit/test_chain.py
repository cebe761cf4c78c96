"""The journal's hash chain: each event's hash covers its content and the one before."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypeAlias

import pytest
import rfc8785
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lantern.engine.chain import GENESIS, canonical, first_broken, link
from lantern.engine.journal import EventWriter
from lantern.store.codec import canonical_json
from lantern.store.records import Event, NewEvent


def stored(run_id: str, events: list[NewEvent]) -> list[Event]:
    return [
        Event(
            run_id, e.seq, e.kind, e.at, e.data, e.step_id, e.node_id, e.attempt, None, None, e.hash
        )
        for e in events
    ]


def journal() -> list[Event]:
    w = EventWriter("run_x")
    events = [
        w.event("run_started", {"worker": "w1"}),
        w.event("step_started", {"type": "tool"}, step_id="a", attempt=1),
        w.completed("a", 1, {"text": "héllo", "n": 1.5}),
        w.event("run_succeeded", {"output": {"n": 1.5}}),
    ]
    return stored("run_x", events)


def test_a_journal_written_by_the_engine_verifies() -> None:
    events = journal()
    assert first_broken(events) is None
    first = events[0]
    body = canonical("run_x", 1, "run_started", None, None, None, first.at, {"worker": "w1"})
    assert first.hash == link(GENESIS, body)
    assert events[1].hash == link(
        str(first.hash),
        canonical("run_x", 2, "step_started", "a", "a", 1, events[1].at, {"type": "tool"}),
    )


def test_changing_any_event_names_it() -> None:
    for index in range(4):
        events = journal()
        events[index] = replace(events[index], data={**events[index].data, "x": 1})
        assert first_broken(events) == (
            index + 1,
            "its hash does not match its content and the hash before it",
        )


def test_a_missing_or_reordered_event_is_named() -> None:
    events = journal()
    assert first_broken([events[0], events[2], events[3]]) is not None
    assert first_broken(events[:3]) is None  # a prefix of a chain is a valid chain


def test_the_chain_continues_across_writers() -> None:
    events = journal()
    more = EventWriter("run_x", events[-1].seq, str(events[-1].hash))
    tail = stored("run_x", [more.event("run_recovered", {"toWorker": "w2"})])
    assert first_broken(events + tail) is None


def test_times_are_kept_to_the_millisecond() -> None:
    at = datetime(2026, 11, 30, 9, 0, 0, 123999, tzinfo=UTC)
    a = canonical("r", 1, "k", None, None, None, at, {})
    b = canonical("r", 1, "k", None, None, None, at.replace(microsecond=124000), {})
    assert a == b and b'"atMs":1796029200124' in a


JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(data=json_values)
@settings(max_examples=300, deadline=None)
def test_canonical_form_is_rfc_8785(data: JsonValue) -> None:
    assume(not any(0xD800 <= ord(c) <= 0xDFFF for c in repr(data)))
    at = datetime(2026, 11, 30, tzinfo=UTC)
    expected = rfc8785.dumps(
        {
            "runId": "r",
            "seq": 1,
            "kind": "k",
            "stepId": None,
            "nodeId": None,
            "attempt": None,
            "atMs": round(at.timestamp() * 1000),
            "data": data,
        }
    )
    assert canonical("r", 1, "k", None, None, None, at, data) == expected


def test_a_large_float_hashes_alike_as_the_integer_postgresql_gives_back() -> None:
    at = datetime(2026, 11, 30, tzinfo=UTC)
    as_written = canonical("r", 1, "k", None, None, None, at, {"x": 5.799163883669751e16})
    as_read = canonical("r", 1, "k", None, None, None, at, {"x": 57991638836697510})
    assert as_written == as_read and b'"x":57991638836697510' in as_read


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"usage": 1.5, "score": float("nan")}, rfc8785.FloatDomainError),
        ({"usage": 1.5, "score": float("-inf")}, rfc8785.FloatDomainError),
        ({"usage": 1.5, "id": 2**60 + 1}, rfc8785.IntegerDomainError),
        ({"usage": 1.5, "text": "\ud800"}, rfc8785.CanonicalizationError),
        ({"usage": 1.5, "nested": {1: "a"}}, rfc8785.CanonicalizationError),
    ],
)
def test_what_canonical_json_cannot_hold_is_refused_as_rfc8785_refuses_it(
    value: Any, error: type[Exception]
) -> None:
    """A value with a float in it is written part by part (the library only for its numbers):
    what it cannot hold is still refused with the library's errors, which ``chain_problem``
    turns into the API's messages."""
    with pytest.raises(error):
        canonical_json(value)
    with pytest.raises(error):
        rfc8785.dumps(value)


def test_floats_of_every_magnitude_and_tuples_are_written_as_rfc8785_writes_them() -> None:
    values = [0.0, -0.0, 5.0, -2.5, 1e-4, 9.99e-5, 4.5e-06, 1e-7, 1e-6, 0.1 + 0.2, 1e15 + 0.5]
    values += [2.0**53, 2.0**53 + 2, 1e16, 1e21, 1.5e300, 5e-324, 123456789.123]
    # Keys in UTF-16 order, which is not code point order past the BMP: U+1F600 before U+E000.
    keys = {"\ue000": 1, "\U0001f600": 2.5, "é": {"ü": -1e-5, "a": [None, True]}}
    value: Any = {"floats": values, "pair": (1, 2.5), **keys}
    assert canonical_json(value) == rfc8785.dumps(value)
