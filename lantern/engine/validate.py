"""What only the serving app knows at apply time: whether the tools a definition names exist.

The definition's own checks (lantern.engine.graph) need nothing but the definition; these need
the app the server loaded with ``--app``, and are reported together with those.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Whether the serving app can run a tool of this name.
Knows = Callable[[str], bool]


def tool_problems(definition: Any, knows: Knows) -> list[str]:
    """One problem per tool the definition names that the app does not register."""
    if not isinstance(definition, dict):
        return []
    problems = []
    graph = definition.get("graph")
    nodes = graph.get("nodes") if isinstance(graph, dict) else None
    for node in nodes if isinstance(nodes, list) else []:
        if not isinstance(node, dict) or not isinstance(node.get("data"), dict):
            continue
        data, where = node["data"], f"node {node.get('id')!r}"
        if node.get("type") == "tool" and isinstance(data.get("tool"), str):
            if not knows(data["tool"]):
                problems.append(f"{where}: tool {data['tool']!r} is not registered by the app")
        evaluator = (
            (data.get("confidence") or {}) if isinstance(data.get("confidence"), dict) else {}
        )
        named = evaluator.get("evaluator")
        if isinstance(named, str) and named.startswith("tool:") and not knows(named[5:]):
            problems.append(
                f"{where}: confidence evaluator tool {named[5:]!r} is not registered by the app"
            )
    tools = definition.get("tools") if "graph" not in definition else None
    for name in tools if isinstance(tools, list) else []:
        if isinstance(name, str) and not name.endswith(".*") and not knows(name):
            problems.append(f"the agent: tool {name!r} is not registered by the app")
    return problems
