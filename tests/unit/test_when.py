"""Edges with ``when``: which branch a run takes, what is skipped, and what validation refuses."""

from __future__ import annotations

from typing import Any

import pytest

from lantern.engine.graph import Graph, parse_agent
from lantern.engine.interpreter import finished, ready, skipped
from lantern.errors import DefinitionError, TemplateError

REFUND = "{{ steps.classify.output.kind == 'refund' }}"


def triage(**extra_edges: Any) -> dict[str, Any]:
    """start -> classify -> (refund | answer) -> done, the branches chosen by ``when``."""
    tool = {"tool": "t"}
    return {
        "name": "triage",
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                *(
                    {"id": n, "type": "tool", "data": tool}
                    for n in ("classify", "refund", "answer", "done")
                ),
            ],
            "edges": [
                {"source": "start", "target": "classify"},
                {"source": "classify", "target": "refund", "when": REFUND},
                {
                    "source": "classify",
                    "target": "answer",
                    "when": "{{ steps.classify.output.kind != 'refund' and not input.vip }}",
                },
                {"source": "refund", "target": "done"},
                {"source": "answer", "target": "done"},
            ],
        },
    }


def parsed(definition: dict[str, Any]) -> Graph:
    g = parse_agent(definition)
    assert isinstance(g, Graph)
    return g


def test_the_branch_whose_when_holds_runs_and_the_other_is_skipped() -> None:
    g = parsed(triage())
    outputs: dict[str, Any] = {"start": {}, "classify": {"kind": "refund"}}
    assert ready(g, outputs, outputs.keys(), {}) == ["refund"]
    assert skipped(g, outputs, {}) == {"answer"}
    assert not finished(g, outputs, {})
    outputs["refund"] = {"ok": True}
    # the join runs: one of its edges is taken, the other's source was skipped
    assert ready(g, outputs, outputs.keys(), {}) == ["done"]
    outputs["done"] = {}
    assert finished(g, outputs, {})


def test_when_reads_the_input_and_nothing_taken_skips_everything_behind() -> None:
    g = parsed(triage())
    outputs: dict[str, Any] = {"start": {}, "classify": {"kind": "question"}}
    assert ready(g, outputs, outputs.keys(), {"vip": False}) == ["answer"]
    assert ready(g, outputs, outputs.keys(), {"vip": True}) == []
    assert skipped(g, outputs, {"vip": True}) == {"refund", "answer", "done"}
    assert finished(g, outputs, {"vip": True})


def test_nothing_is_decided_before_the_source_completes() -> None:
    g = parsed(triage())
    assert skipped(g, {"start": {}}, {}) == set()
    assert ready(g, {"start": {}}, {"start"}, {}) == ["classify"]


def test_a_when_that_cannot_be_evaluated_raises_naming_its_edge() -> None:
    g = parsed(triage())
    outputs: dict[str, Any] = {"start": {}, "classify": {"no kind": 1}}
    with pytest.raises(TemplateError, match="edge classify -> refund"):
        ready(g, outputs, outputs.keys(), {})


def test_when_combines_with_an_approvals_on() -> None:
    g = parsed(
        {
            "name": "a",
            "graph": {
                "nodes": [
                    {"id": "start", "type": "trigger"},
                    {"id": "ok", "type": "approval"},
                    {"id": "big", "type": "tool", "data": {"tool": "t"}},
                ],
                "edges": [
                    {"source": "start", "target": "ok"},
                    {
                        "source": "ok",
                        "target": "big",
                        "on": "approved",
                        "when": "{{ input.amount > 100 }}",
                    },
                ],
            },
        }
    )
    approved: dict[str, Any] = {"start": {}, "ok": {"decision": "approved"}}
    assert ready(g, approved, approved.keys(), {"amount": 500}) == ["big"]
    assert ready(g, approved, approved.keys(), {"amount": 5}) == []
    rejected: dict[str, Any] = {"start": {}, "ok": {"decision": "rejected"}}
    assert skipped(g, rejected, {"amount": 500}) == {"big"}


@pytest.mark.parametrize(
    "when, words",
    [
        ("refund", "must be exactly one {{ expression }}"),
        ("{{ input.a }} and {{ input.b }}", "must be exactly one {{ expression }}"),
        ("{{ input.a ==  }}", "does not parse"),
        (42, "must be a string"),
        ("{{ steps.answer.output.x }}", "reads steps.answer, which is not 'classify'"),
        ("{{ steps['ghost'].output }}", "there is no node 'ghost'"),
    ],
)
def test_validation_refuses_a_bad_when_naming_the_edge(when: Any, words: str) -> None:
    definition = triage()
    definition["graph"]["edges"][1]["when"] = when
    with pytest.raises(DefinitionError) as caught:
        parse_agent(definition)
    found = [p for p in caught.value.problems if words in p]
    assert found and all("classify -> refund" in p for p in found), caught.value.problems


def test_a_when_may_read_its_sources_ancestors() -> None:
    definition = triage()
    definition["graph"]["edges"][3]["when"] = "{{ steps.classify.output.kind and steps.refund }}"
    g = parsed(definition)
    assert g.whens[("refund", "done")].startswith("{{ steps.classify")
