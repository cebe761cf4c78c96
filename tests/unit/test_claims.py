"""What a claim takes (lantern/store/claims.py), decided without I/O: per-key limits,
maxConcurrentRuns, priority, round-robin between workspaces, parked runs first."""

from __future__ import annotations

from itertools import count

from lantern.store.claims import Candidate, pick

_at = count()


def run(
    id: str,
    *,
    ws: str = "w",
    key: str | None = None,
    limit: int | None = None,
    most: int | None = None,
    priority: int = 5,
    woken: bool = False,
) -> Candidate:
    return Candidate(id, ws, "agent", priority, next(_at), key, limit, most, woken)


def ids(chosen: list[Candidate]) -> list[str]:
    return [c.id for c in chosen]


def test_a_key_at_its_limit_starts_nothing_more_and_other_keys_go_on() -> None:
    queued = [run(f"a{i}", key="acme", limit=2) for i in range(4)]
    queued += [run("b0", key="bolt", limit=2)]
    assert ids(pick(queued, [], [], {}, 10)) == ["a0", "a1", "b0"]
    assert ids(pick(queued, [], [(("w", "agent", "acme"), 1)], {}, 10)) == ["a0", "b0"]
    assert ids(pick(queued, [], [(("w", "agent", "acme"), 2)], {}, 10)) == ["b0"]


def test_max_concurrent_runs_bounds_the_agent_whatever_the_key() -> None:
    queued = [run(f"r{i}", key=f"k{i}", limit=1, most=3) for i in range(5)]
    assert ids(pick(queued, [], [], {}, 10)) == ["r0", "r1", "r2"]
    held = [(("w", "agent", "k9"), 2)]
    assert ids(pick(queued, [], held, {}, 10)) == ["r0"]
    alone = [run(f"m{i}", key="", most=2) for i in range(3)]  # maxConcurrentRuns alone
    assert ids(pick(alone, [], [], {}, 10)) == ["m0", "m1"]


def test_higher_priority_first_then_the_oldest() -> None:
    queued = [run("old-low", priority=1), run("mid", priority=5), run("new-high", priority=9)]
    queued += [run("newer-high", priority=9)]
    assert ids(pick(queued, [], [], {}, 3)) == ["new-high", "newer-high", "mid"]


def test_workspaces_take_turns_least_recently_served_first() -> None:
    busy = [run(f"busy{i}", ws="busy") for i in range(1000)]
    lone = [run("lone", ws="lone")]
    served = {"busy": 5.0}  # "lone" was never served: it goes first
    assert ids(pick(busy + lone, [], [], served, 3)) == ["lone", "busy0", "busy1"]
    assert ids(pick(busy + lone, [], [], {"busy": 1.0, "lone": 2.0}, 3)) == [
        "busy0",
        "lone",
        "busy1",
    ]


def test_a_due_parked_run_resumes_before_queued_runs_of_its_key() -> None:
    queued = [run("q0", key="acme", limit=1)]
    woken = [run("parked", key="acme", limit=1, woken=True)]
    assert ids(pick(queued, woken, [], {}, 10)) == ["parked"]
    held = [(("w", "agent", "acme"), 1)]
    assert pick(queued, woken, held, {}, 10) == []


def test_a_walk_sees_each_group_once_and_stops_at_enough_open_groups() -> None:
    """claims.Walk: a group is seen through its first shown run not leased; its later shown
    runs are passed; the walk stops once it has as many open groups as the claim may take."""
    from lantern.store.claims import Entry, Slots, Walk, marks

    full, a, b, c = (("w", "agent", k) for k in ("full", "a", "b", "c"))
    walk = Walk(Slots([(full, 1)]), 2)
    walk.feed(
        [
            Entry("f1", full, False, 1, None),  # at its limit: seen, not open
            Entry("f2", full, False, 1, None),  # a later run of a seen group: passed
            Entry("a1", a, True, 2, None),  # taken by a claim, not opened yet: stepped over
            Entry("a2", a, False, 2, None),
            Entry("b1", b, False, 1, None),
            Entry("c1", c, False, 1, None),  # never read: two groups were enough
        ]
    )
    assert walk.done and walk.open == [(a, 2), (b, 1)]
    assert walk.hide == ["f2"]
    taken = Candidate("b1", "w", "agent", 5, 0, "b", 1, None)
    assert marks([walk], [taken]) == (["f2"], [b])
