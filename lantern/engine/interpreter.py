"""Decide, don't do: which nodes run next, as a pure function of the graph and the journal.

A node is ready when every predecessor has completed and it has not started. A run is done
when every node has completed (validation guarantees all are reachable from the trigger).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from lantern.engine.graph import Graph


def ready(graph: Graph, completed: Collection[str], started: Collection[str]) -> list[str]:
    """Nodes to start now, in definition order."""
    return [
        n
        for n in graph.nodes
        if n not in started
        and n not in completed
        and all(p in completed for p in graph.predecessors[n])
    ]


def finished(graph: Graph, completed: Collection[str]) -> bool:
    return all(n in completed for n in graph.nodes)


def run_output(graph: Graph, outputs: Mapping[str, Any]) -> Any:
    """A run's output: its one final node's output, or ``{nodeId: output}`` for several."""
    sinks = graph.sinks
    if len(sinks) == 1:
        return outputs[sinks[0]]
    return {n: outputs[n] for n in sinks}


def ancestors(graph: Graph, node: str) -> frozenset[str]:
    """Every node upstream of ``node``: the steps its templates may read.

    Limiting templates to ancestors keeps a step's inputs the same in every re-drive, whatever
    order parallel branches happened to finish in.
    """
    return graph.upstream[node]
