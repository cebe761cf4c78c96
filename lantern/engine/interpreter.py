"""Decide, don't do: which nodes run next, as a pure function of the graph and the journal.

An edge is taken when its source has completed, its decision matches (an edge out of an
approval: ``on``, approved when unmarked) and its ``when`` holds over the input and the
journaled outputs. A node whose predecessors have all completed or been skipped is ready when
at least one incoming edge is taken, and skipped when none is (so a node behind a skipped one
is skipped unless another edge reaches it). A run is done when every node has completed or
been skipped (validation guarantees all are reachable from the trigger).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from lantern.engine import when
from lantern.engine.graph import Graph


def ready(
    graph: Graph, completed: Mapping[str, Any], started: Collection[str], input: Any = None
) -> list[str]:
    """Nodes to start now, in definition order (``completed``: step outputs by node).

    A ``when`` that cannot be evaluated raises TemplateError naming its edge."""
    if not graph.conditions and not graph.whens:  # the common case: every edge is taken
        return [
            n
            for n in graph.nodes
            if n not in started
            and n not in completed
            and all(p in completed for p in graph.predecessors[n])
        ]
    skip = skipped(graph, completed, input)
    return [
        n
        for n in graph.nodes
        if n not in started
        and n not in completed
        and n not in skip
        and all(p in completed or p in skip for p in graph.predecessors[n])
    ]


def skipped(graph: Graph, completed: Mapping[str, Any], input: Any = None) -> set[str]:
    """Nodes that will never run: every predecessor is settled and no edge in is taken."""
    if not graph.conditions and not graph.whens:
        return set()
    found: set[str] = set()
    for n in graph.order:
        preds = graph.predecessors[n]
        if not preds or n in completed:
            continue
        if not all(p in completed or p in found for p in preds):
            continue  # a predecessor is still to run: not decided yet
        if not any(p in completed and taken(graph, p, n, completed, input) for p in preds):
            found.add(n)
    return found


def taken(graph: Graph, source: str, target: str, completed: Mapping[str, Any], input: Any) -> bool:
    """Whether the edge source -> target is taken, its source having completed."""
    condition = graph.conditions.get((source, target))
    if condition is not None:
        output = completed[source]
        if not (isinstance(output, dict) and output.get("decision") == condition):
            return False
    expression = graph.whens.get((source, target))
    if expression is None:
        return True
    visible = graph.ancestors(source) | {source}
    scope = {
        "input": input,
        "steps": {s: {"output": o} for s, o in completed.items() if s in visible},
    }
    return when.holds(expression, scope, where=f"the 'when' of edge {source} -> {target}")


def finished(graph: Graph, completed: Mapping[str, Any], input: Any = None) -> bool:
    if all(n in completed for n in graph.nodes):
        return True
    skip = skipped(graph, completed, input)
    return all(n in completed or n in skip for n in graph.nodes)


def run_output(graph: Graph, outputs: Mapping[str, Any]) -> Any:
    """A run's output: its one final node's output, or ``{nodeId: output}`` for several
    (final nodes that were skipped are left out)."""
    sinks = [n for n in graph.sinks if n in outputs]
    if len(sinks) == 1:
        return outputs[sinks[0]]
    return {n: outputs[n] for n in sinks}


def ancestors(graph: Graph, node: str) -> frozenset[str]:
    """Every node upstream of ``node``: the steps its templates may read.

    Limiting templates to ancestors keeps a step's inputs the same in every re-drive, whatever
    order parallel branches happened to finish in.
    """
    return graph.ancestors(node)


@dataclass(frozen=True)
class Plan:
    """What follows from the journal so far: the nodes to start, and whether the run ends."""

    start: tuple[str, ...]
    done: bool  # every node completed or skipped, and nothing parked
    output: Any = None  # the run's output, when done
    skipped: frozenset[str] = frozenset()  # nodes no taken edge reaches (journal step_skipped)


def plan(
    graph: Graph,
    completed: Mapping[str, Any],
    started: Collection[str],
    *,
    parked: bool = False,
    hold: bool = False,
    input: Any = None,
) -> Plan:
    """The next actions of a graph run, decided from its journal alone (no I/O).

    ``parked``: some step waits (an approval, a sub-agent), so the run cannot end yet;
    ``hold``: start nothing (an anomaly's pause, a clean stop); ``input``: the run's input,
    which edges' ``when`` may read. A ``when`` that cannot be evaluated raises TemplateError.
    """
    start = () if hold else tuple(ready(graph, completed, started, input))
    done = not parked and finished(graph, completed, input)
    skip = frozenset(skipped(graph, completed, input))
    return Plan(start, done, run_output(graph, completed) if done else None, skip)
