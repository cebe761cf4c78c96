"""Decide, don't do: which nodes run next, as a pure function of the graph and the journal.

A node is ready when every predecessor has completed, every edge into it is taken, and it has
not started. An edge out of an approval is taken on its decision (``on``, approved when
unmarked); a node behind an edge not taken, or behind a skipped node, is skipped. A run is
done when every node has completed or been skipped (validation guarantees all are reachable
from the trigger).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from lantern.engine.graph import Graph


def ready(graph: Graph, completed: Mapping[str, Any], started: Collection[str]) -> list[str]:
    """Nodes to start now, in definition order (``completed``: step outputs by node)."""
    if not graph.conditions:  # the common case: no decision anywhere, nothing skipped
        return [
            n
            for n in graph.nodes
            if n not in started
            and n not in completed
            and all(p in completed for p in graph.predecessors[n])
        ]
    skip = skipped(graph, completed)
    return [
        n
        for n in graph.nodes
        if n not in started
        and n not in completed
        and n not in skip
        and all(p in completed for p in graph.predecessors[n])
    ]


def skipped(graph: Graph, completed: Mapping[str, Any]) -> set[str]:
    """Nodes that will never run: behind an edge its decision did not take."""
    if not graph.conditions:
        return set()
    found: set[str] = set()
    for n in graph.order:
        for p in graph.predecessors[n]:
            if p in found or (p in completed and not _taken(graph, p, n, completed[p])):
                found.add(n)
                break
    return found


def _taken(graph: Graph, source: str, target: str, output: Any) -> bool:
    condition = graph.conditions.get((source, target))
    return condition is None or (isinstance(output, dict) and output.get("decision") == condition)


def finished(graph: Graph, completed: Mapping[str, Any]) -> bool:
    if all(n in completed for n in graph.nodes):
        return True
    skip = skipped(graph, completed)
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


def plan(
    graph: Graph,
    completed: Mapping[str, Any],
    started: Collection[str],
    *,
    parked: bool = False,
    hold: bool = False,
) -> Plan:
    """The next actions of a graph run, decided from its journal alone (no I/O).

    ``parked``: some step waits (an approval, a sub-agent), so the run cannot end yet;
    ``hold``: start nothing (an anomaly's pause, a clean stop).
    """
    start = () if hold else tuple(ready(graph, completed, started))
    done = not parked and finished(graph, completed)
    return Plan(start, done, run_output(graph, completed) if done else None)
