"""The interpreter: which nodes run next, when a run is done, and what it returns."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from lantern.engine.graph import Graph, parse_agent
from lantern.engine.interpreter import ancestors, finished, ready, run_output


def graph(*edges: tuple[str, str]) -> Graph:
    """A graph from its edges: 'start' is the trigger, every other node is a tool."""
    ids: list[str] = ["start"]
    for pair in edges:
        for n in pair:
            if n not in ids:
                ids.append(n)
    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"}]
    nodes += [{"id": n, "type": "tool", "data": {"tool": "t"}} for n in ids[1:]]
    parsed = parse_agent(
        {
            "name": "g",
            "graph": {"nodes": nodes, "edges": [{"source": s, "target": t} for s, t in edges]},
        }
    )
    assert isinstance(parsed, Graph)
    return parsed


def outputs(ids: Iterable[str]) -> dict[str, Any]:
    """Completed steps as the interpreter takes them, outputs by node: null outputs here, as
    these graphs have no conditions and only which nodes completed matters."""
    return dict.fromkeys(ids)


CHAIN = graph(("start", "a"), ("a", "b"), ("b", "c"))
# start -> a, start -> b, a -> join, b -> join, join -> end
DIAMOND = graph(("start", "a"), ("start", "b"), ("a", "join"), ("b", "join"), ("join", "end"))
# start -> a -> c, start -> b, with a second sink b and a third sink d off a
FORK = graph(("start", "a"), ("start", "b"), ("a", "c"), ("a", "d"))


# ---------------------------------------------------------------- ready


def test_ready_walks_a_chain_one_node_at_a_time() -> None:
    assert ready(CHAIN, completed={}, started=set()) == ["start"]
    assert ready(CHAIN, completed=outputs({"start"}), started={"start"}) == ["a"]
    assert (
        ready(CHAIN, completed=outputs({"start"}), started={"start", "a"}) == []
    )  # a is in flight
    assert ready(CHAIN, completed=outputs({"start", "a"}), started={"start", "a"}) == ["b"]
    assert ready(CHAIN, completed=outputs({"start", "a", "b"}), started={"start", "a", "b"}) == [
        "c"
    ]
    everything = {"start", "a", "b", "c"}
    assert ready(CHAIN, completed=outputs(everything), started=everything) == []


def test_ready_starts_both_branches_of_a_diamond_together() -> None:
    assert ready(DIAMOND, outputs({"start"}), {"start"}) == ["a", "b"]  # in definition order


def test_a_join_waits_for_every_predecessor() -> None:
    done = {"start", "a"}
    assert ready(DIAMOND, outputs(done), done | {"b"}) == []  # b still in flight
    assert ready(DIAMOND, outputs(done), done) == ["b"]  # b not even started: b, not the join
    done = {"start", "b"}
    assert ready(DIAMOND, outputs(done), done | {"a"}) == []
    done = {"start", "a", "b"}
    assert ready(DIAMOND, outputs(done), done) == ["join"]
    done |= {"join"}
    assert ready(DIAMOND, outputs(done), done) == ["end"]


def test_ready_never_returns_a_started_or_completed_node() -> None:
    done = {"start", "a", "b"}
    assert ready(DIAMOND, outputs(done), done | {"join"}) == []
    # completed but (oddly) absent from started: still not ready again
    assert ready(DIAMOND, outputs({"start", "a", "b", "join"}), {"start"}) == ["end"]


def test_ready_takes_any_collection() -> None:
    outputs = {"start": {"x": 1}, "a": None}
    assert ready(FORK, outputs, list(outputs)) == ["b", "c", "d"]


# ---------------------------------------------------------------- finished


def test_finished_needs_every_node_completed() -> None:
    assert not finished(DIAMOND, {})
    assert not finished(DIAMOND, outputs({"start", "a", "b", "join"}))
    assert finished(DIAMOND, outputs({"start", "a", "b", "join", "end"}))


def test_finished_ignores_steps_that_are_only_started() -> None:
    assert not finished(CHAIN, outputs({"start", "a", "b"}))
    assert finished(CHAIN, {"start": 1, "a": 2, "b": 3, "c": 4})


# ---------------------------------------------------------------- run_output


def test_one_sink_gives_its_output_itself() -> None:
    outputs = {"start": {"x": 1}, "a": 2, "b": [3], "c": {"answer": 42}}
    assert run_output(CHAIN, outputs) == {"answer": 42}


def test_one_sink_whose_output_is_null() -> None:
    assert run_output(CHAIN, {"start": {}, "a": 1, "b": 2, "c": None}) is None


def test_several_sinks_give_an_object_by_node_id() -> None:
    outputs = {"start": {}, "a": "A", "b": "B", "c": "C", "d": {"D": True}}
    result = run_output(FORK, outputs)
    assert result == {"b": "B", "c": "C", "d": {"D": True}}
    assert list(result) == ["b", "c", "d"]


def test_a_trigger_alone_outputs_the_input() -> None:
    alone = parse_agent(
        {"name": "echo", "graph": {"nodes": [{"id": "start", "type": "trigger"}], "edges": []}}
    )
    assert isinstance(alone, Graph)
    assert run_output(alone, {"start": {"x": 1}}) == {"x": 1}


# ---------------------------------------------------------------- ancestors


@pytest.mark.parametrize(
    ("g", "node", "expected"),
    [
        (CHAIN, "start", set()),
        (CHAIN, "a", {"start"}),
        (CHAIN, "c", {"start", "a", "b"}),
        (DIAMOND, "a", {"start"}),
        (DIAMOND, "join", {"start", "a", "b"}),
        (DIAMOND, "end", {"start", "a", "b", "join"}),
        (FORK, "b", {"start"}),  # not its sibling a, nor a's children
        (FORK, "d", {"start", "a"}),  # not its sibling c
    ],
)
def test_ancestors_are_every_node_upstream(g: Graph, node: str, expected: set[str]) -> None:
    result = ancestors(g, node)
    assert isinstance(result, frozenset)
    assert result == expected
