"""Agent definitions: parsing and validation into an immutable ``Graph``.

Validation collects every problem before it fails, so one error names them all.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from lantern import flow, limits
from lantern.engine import anomalies, when
from lantern.engine.microvm import MicroVmAgent, parse_microvm
from lantern.errors import DefinitionError
from lantern.models import registry
from lantern.models.budget import budget_problems
from lantern.models.router import Routes
from lantern.nodes import templates
from lantern.nodes.base import Node
from lantern.nodes.registry import AVAILABLE_TYPES, PLANNED_TYPES

__all__ = ["Graph", "Node", "PlainAgent", "parse_agent"]
# An edge out of an approval may be taken on one decision only; an unmarked one on approval.
EDGE_CONDITIONS = frozenset({"approved", "rejected"})
RETRYABLE_CLASSES = frozenset({"any", "timeout", "llm", "connector", "tool"})
HTTP_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"})
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@dataclass(frozen=True)
class Graph:
    name: str
    nodes: Mapping[str, Node]  # in definition order
    predecessors: Mapping[str, tuple[str, ...]]
    successors: Mapping[str, tuple[str, ...]]
    trigger: str
    budget: Mapping[str, Any] | None = None  # the agent's {maxUsd, maxTokens}
    timeout_ms: int | None = None  # the agent's default step timeout (a node's overrides it)
    # (source, target) -> the decision of the source approval that takes the edge
    conditions: Mapping[tuple[str, str], str] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )
    # (source, target) -> the edge's ``when`` expression (lantern.engine.when)
    whens: Mapping[tuple[str, str], str] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )
    # anomaly kind -> its limits and policy (lantern.engine.anomalies)
    anomalies: Mapping[str, dict[str, Any]] = dataclasses.field(
        default_factory=lambda: anomalies.settings({})
    )

    @property
    def sinks(self) -> tuple[str, ...]:
        return tuple(n for n in self.nodes if not self.successors[n])

    @functools.cached_property
    def order(self) -> tuple[str, ...]:
        """The nodes in a topological order (every node after its predecessors)."""
        found: list[str] = []
        waiting = {n: len(self.predecessors[n]) for n in self.nodes}
        ready = deque(n for n, count in waiting.items() if count == 0)
        while ready:
            n = ready.popleft()
            found.append(n)
            for s in self.successors[n]:
                waiting[s] -= 1
                if waiting[s] == 0:
                    ready.append(s)
        return tuple(found)

    def ancestors(self, node: str) -> frozenset[str]:
        """Every node upstream of ``node``: a walk over predecessors, linear in the graph.
        (A table of every node's ancestors would be quadratic: 346 MB for a 4,000-node chain.)"""
        seen: set[str] = set()
        stack = list(self.predecessors[node])
        while stack:
            n = stack.pop()
            if n not in seen:
                seen.add(n)
                stack.extend(self.predecessors[n])
        return frozenset(seen)


@dataclass(frozen=True)
class PlainAgent:
    """An agent with a model and tools and no graph: model turn, tool calls, model turn, ..."""

    name: str
    model: str
    system: str | None
    tools: tuple[str, ...]
    max_turns: int
    temperature: float | None
    max_tokens: int | None
    budget: Mapping[str, Any] | None
    retry: Mapping[str, Any] | None = None  # the model turns' retry policy, as a node's
    timeout_ms: int | None = None  # the limit of each model turn and tool call
    anomalies: Mapping[str, dict[str, Any]] = dataclasses.field(
        default_factory=lambda: anomalies.settings({})
    )


PLAIN_FIELDS = frozenset(
    {
        "name",
        "model",
        "system",
        "tools",
        "maxTurns",
        "temperature",
        "maxTokens",
        "budget",
        "retry",
        "timeoutMs",
        "anomalies",
        "concurrency",
        "maxConcurrentRuns",
    }
)
DEFAULT_MAX_TURNS = 10
# A graph agent's top-level fields; any other is a typo the user would never hear of.
GRAPH_FIELDS = frozenset(
    {
        "name",
        "description",
        "graph",
        "budget",
        "anomalies",
        "timeoutMs",
        "runtime",
        "concurrency",
        "maxConcurrentRuns",
    }
)


def parse_agent(definition: Any, routes: Routes | None = None) -> Graph | PlainAgent | MicroVmAgent:
    """Validate a whole agent definition and return its graph, or raise DefinitionError.

    ``routes``: the configured model routes a ``route:NAME`` model must name; None leaves
    route names unchecked (a model call then says whether its route is known)."""
    if not isinstance(definition, dict):
        raise DefinitionError(["the definition must be a JSON object"])
    problems: list[str] = []
    name = definition.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        problems.append(
            "name must be 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    if "budget" in definition:
        problems += budget_problems("the agent", definition["budget"])
    if "anomalies" in definition:
        anomalies.check_config(definition["anomalies"], problems)
    problems += flow.problems(definition)
    if "runtime" in definition:
        agent = parse_microvm(str(name), definition, problems)
        if problems:
            raise DefinitionError(problems)
        return agent
    graph = definition.get("graph")
    if graph is None:
        if "model" in definition:
            return _parse_plain(definition, problems, routes)
        problems.append("a definition needs a 'graph' with 'nodes' and 'edges'")
        raise DefinitionError(problems)
    if not isinstance(graph, dict):
        raise DefinitionError([*problems, "graph must be an object with 'nodes' and 'edges'"])
    timeout = definition.get("timeoutMs", 1)
    if not _is_int(timeout) or timeout <= 0:
        problems.append("timeoutMs must be a positive integer (milliseconds): every step's limit")
    unknown = set(definition) - GRAPH_FIELDS
    if unknown:
        problems.append(
            f"a graph agent has no fields {', '.join(sorted(map(str, unknown)))}"
            f" (known: {', '.join(sorted(GRAPH_FIELDS))})"
        )
    result = _parse_graph(str(name), graph, problems, routes)
    if problems:
        raise DefinitionError(problems)
    assert result is not None
    return dataclasses.replace(
        result,
        anomalies=anomalies.settings(definition),
        budget=definition.get("budget"),
        timeout_ms=definition.get("timeoutMs"),
    )


def _parse_plain(
    definition: dict[str, Any], problems: list[str], routes: Routes | None
) -> PlainAgent:
    unknown = set(definition) - PLAIN_FIELDS
    if unknown:
        problems.append(
            f"a plain LLM agent has no fields {', '.join(sorted(map(str, unknown)))}"
            f" (known: {', '.join(sorted(PLAIN_FIELDS))})"
        )
    _check_model_fields("the agent", definition, problems, routes)
    tools = definition.get("tools", [])
    if not isinstance(tools, list) or not all(isinstance(t, str) and t for t in tools):
        problems.append("tools must be a list of tool names")
        tools = []
    elif len(set(tools)) != len(tools):
        problems.append("tools lists a tool more than once")
    if "retry" in definition:
        _check_retry("the agent", definition["retry"], problems)
    timeout = definition.get("timeoutMs", 1)
    if not _is_int(timeout) or timeout <= 0:
        problems.append("timeoutMs must be a positive integer (milliseconds)")
    turns = definition.get("maxTurns", DEFAULT_MAX_TURNS)
    if not _is_int(turns) or not 1 <= turns <= 100:
        problems.append("maxTurns must be an integer from 1 to 100")
    if problems:
        raise DefinitionError(problems)
    return PlainAgent(
        name=str(definition["name"]),
        model=definition["model"],
        system=definition.get("system"),
        tools=tuple(tools),
        max_turns=turns,
        temperature=definition.get("temperature"),
        max_tokens=definition.get("maxTokens"),
        budget=definition.get("budget"),
        retry=definition.get("retry"),
        timeout_ms=definition.get("timeoutMs"),
        anomalies=anomalies.settings(definition),
    )


def _check_model_fields(
    where: str, data: Mapping[str, Any], problems: list[str], routes: Routes | None
) -> None:
    """model, system, temperature and maxTokens, as ai-step nodes and plain agents share them."""
    model = data.get("model")
    if not isinstance(model, str) or not model:
        problems.append(f"{where}: needs a model (a model name, offline/..., or route:NAME)")
    else:
        problem = registry.model_problem(model, routes)
        if problem is not None:
            problems.append(f"{where}: {problem}")
    if "system" in data and not isinstance(data["system"], str):
        problems.append(f"{where}: system must be a string (templates allowed)")
    temperature = data.get("temperature", 0)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        problems.append(f"{where}: temperature must be a number")
    elif not 0 <= temperature <= 2:
        problems.append(f"{where}: temperature must be from 0 to 2")
    max_tokens = data.get("maxTokens", 1)
    if not _is_int(max_tokens) or max_tokens < 1:
        problems.append(f"{where}: maxTokens must be a positive integer")


def _parse_graph(
    name: str, graph: dict[str, Any], problems: list[str], routes: Routes | None
) -> Graph | None:
    raw_nodes = graph.get("nodes")
    raw_edges = graph.get("edges", [])
    if not isinstance(raw_nodes, list) or not raw_nodes:
        problems.append("graph.nodes must be a non-empty list")
        return None
    if not isinstance(raw_edges, list):
        problems.append("graph.edges must be a list")
        return None
    if len(raw_nodes) > limits.MAX_NODES or len(raw_edges) > limits.MAX_EDGES:
        problems.append(
            f"the graph has {len(raw_nodes)} nodes and {len(raw_edges)} edges; the limits are "
            f"{limits.MAX_NODES} nodes and {limits.MAX_EDGES} edges"
        )
        return None

    nodes: dict[str, Node] = {}
    for index, raw in enumerate(raw_nodes):
        node = _parse_node(index, raw, problems, routes)
        if node is None:
            continue
        if node.id in nodes:
            problems.append(f"node {node.id!r}: duplicate id")
            continue
        nodes[node.id] = node

    node_problems = len(problems)  # the graph's shape can still be checked past these
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    pred: dict[str, list[str]] = {n: [] for n in nodes}
    conditions: dict[tuple[str, str], str] = {}
    whens: dict[tuple[str, str], str] = {}
    for index, edge in enumerate(raw_edges):
        if not isinstance(edge, dict):
            problems.append(f"edge {index}: must be an object with 'source' and 'target'")
            continue
        source, target = edge.get("source"), edge.get("target")
        ok = True
        for end, value in (("source", source), ("target", target)):
            if not isinstance(value, str) or value not in nodes:
                problems.append(
                    f"edge {index} ({source} -> {target}): {end} node {value!r} does not exist"
                )
                ok = False
        if ok:
            assert isinstance(source, str) and isinstance(target, str)
            if target not in succ[source]:  # an edge listed twice is still one edge
                succ[source].append(target)
                pred[target].append(source)
            on = edge.get("on")
            if nodes[source].type == "approval":
                if on is not None and on not in EDGE_CONDITIONS:
                    problems.append(
                        f"edge {index} ({source} -> {target}): 'on' must be"
                        " 'approved' or 'rejected'"
                    )
                conditions[(source, target)] = on if on in EDGE_CONDITIONS else "approved"
            elif on is not None:
                problems.append(
                    f"edge {index} ({source} -> {target}): only an edge out of an approval"
                    " node may have 'on'"
                )
            if "when" in edge:
                bad = when.problem(edge["when"])
                if bad is not None:
                    problems.append(f"edge {index} ({source} -> {target}): {bad}")
                else:
                    whens[(source, target)] = edge["when"]

    triggers = [n.id for n in nodes.values() if n.type == "trigger"]
    if not triggers:
        problems.append("the graph has no trigger node")
    elif len(triggers) > 1:
        problems.append(f"the graph has more than one trigger node: {', '.join(triggers)}")
    for t in triggers:
        if pred[t]:
            problems.append(f"node {t!r}: a trigger cannot have incoming edges")

    cyclic = _cycle_members(succ)
    if cyclic:
        problems.append(f"the graph has a cycle through nodes {', '.join(cyclic)}")
    if len(triggers) == 1:
        seen = _reachable(triggers[0], succ)
        for n in nodes:
            if n not in seen:
                problems.append(f"node {n!r}: unreachable from the trigger {triggers[0]!r}")

    if len(problems) > node_problems:
        return None
    parsed = Graph(
        name=name,
        nodes=MappingProxyType(nodes),
        predecessors=MappingProxyType({k: tuple(v) for k, v in pred.items()}),
        successors=MappingProxyType({k: tuple(v) for k, v in succ.items()}),
        trigger=triggers[0],
        conditions=MappingProxyType(conditions),
        whens=MappingProxyType(whens),
    )
    _check_references(parsed, problems)
    return None if problems else parsed


def _check_references(graph: Graph, problems: list[str]) -> None:
    """A ``when`` may read its source and the source's ancestors; a node's templates, its
    ancestors. Anything else is not journaled before it runs, so a re-drive could see
    something else: refused when the definition is applied, naming the node or edge."""
    for (source, target), text in graph.whens.items():
        readable = graph.ancestors(source) | {source}
        for step in sorted(when.steps_named(text) - readable):
            problems.append(
                f"edge ({source} -> {target}): 'when' reads steps.{step}, which is not"
                f" {source!r} or one of its ancestors"
                + ("" if step in graph.nodes else f" (there is no node {step!r})")
            )
    for node in graph.nodes.values():
        named = set().union(*(when.steps_named(t) for t in when.strings(dict(node.data))))
        if not named:
            continue  # most nodes: no walk over their ancestors at all
        readable = graph.ancestors(node.id)
        for step in sorted(named - readable):
            why = (
                f"there is no node {step!r}"
                if step not in graph.nodes
                else f"{step!r} is not one of its ancestors, so it may not have run yet"
            )
            problems.append(f"node {node.id!r}: a template reads steps.{step}, but {why}")


def _parse_node(index: int, raw: Any, problems: list[str], routes: Routes | None) -> Node | None:
    if not isinstance(raw, dict):
        problems.append(f"node {index}: must be an object")
        return None
    node_id, node_type, data = raw.get("id"), raw.get("type"), raw.get("data", {})
    if not isinstance(node_id, str) or not node_id:
        problems.append(f"node {index}: 'id' must be a non-empty string")
        return None
    where = f"node {node_id!r}"
    if not isinstance(data, dict):
        problems.append(f"{where}: 'data' must be an object")
        data = {}
    if not isinstance(node_type, str):
        problems.append(f"{where}: 'type' must be a string")
    elif node_type in PLANNED_TYPES:
        problems.append(f"{where}: node type {node_type!r} is not available yet")
    elif node_type not in AVAILABLE_TYPES:
        problems.append(
            f"{where}: unknown node type {node_type!r}"
            f" (known: {', '.join(sorted(AVAILABLE_TYPES | PLANNED_TYPES))})"
        )
    elif node_type == "tool":
        if not isinstance(data.get("tool"), str) or not data["tool"]:
            problems.append(f"{where}: a tool node needs data.tool, the tool's name")
        if not isinstance(data.get("args", {}), dict):
            problems.append(f"{where}: data.args must be an object")
    elif node_type == "connector":
        _check_connector(where, data, problems)
    elif node_type == "ai-step":
        _check_ai_step(where, data, problems, routes)
    elif node_type == "approval":
        _check_approval(where, data, problems)
    elif node_type == "signal":
        if not isinstance(data.get("name"), str) or not _NAME.match(data["name"]):
            problems.append(
                f"{where}: a signal node needs data.name, the signal's name (1-100 letters,"
                " digits, '.', '_' or '-')"
            )
    elif node_type == "subagent":
        name = data.get("agentName")
        if not isinstance(name, str) or not _NAME.match(name):
            problems.append(f"{where}: a subagent node needs data.agentName, an agent's name")
    if "retry" in data:
        _check_retry(where, data["retry"], problems)
    timeout = data.get("timeoutMs", 1)
    if not _is_int(timeout) or timeout <= 0:
        problems.append(f"{where}: data.timeoutMs must be a positive integer (milliseconds)")
    _check_templates(where, data, problems)
    return Node(node_id, str(node_type), MappingProxyType(dict(data)))


def _check_connector(where: str, data: dict[str, Any], problems: list[str]) -> None:
    kind = data.get("connector")
    if kind == "http":
        _check_http(where, data, problems)
    elif kind == "email":
        _check_email(where, data, problems)
    else:
        problems.append(f"{where}: unknown connector {kind!r} (known: email, http)")


def _check_ai_step(
    where: str, data: dict[str, Any], problems: list[str], routes: Routes | None
) -> None:
    _check_model_fields(where, data, problems, routes)
    if not isinstance(data.get("prompt"), str):
        problems.append(f"{where}: an ai-step needs data.prompt, a string (templates allowed)")
    for field in ("prompt", "system"):
        text = data.get(field)
        if isinstance(text, str) and templates.names_secrets(text):
            problems.append(
                f"{where}: data.{field} uses secrets; an ai-step may not (what a model answers "
                "is journaled, and could carry a secret in any form)"
            )
    if data.get("responseFormat", "text") not in ("text", "json"):
        problems.append(f"{where}: data.responseFormat must be 'text' or 'json'")
    if "confidence" in data:
        _check_confidence(where, data["confidence"], problems)


def _check_confidence(where: str, conf: Any, problems: list[str]) -> None:
    if not isinstance(conf, dict):
        problems.append(f"{where}: data.confidence must be an object with a threshold")
        return
    threshold = conf.get("threshold")
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        problems.append(f"{where}: data.confidence.threshold must be a number from 0 to 1")
    elif not 0 <= threshold <= 1:
        problems.append(f"{where}: data.confidence.threshold must be a number from 0 to 1")
    evaluator = conf.get("evaluator", "self")
    if not isinstance(evaluator, str) or not (
        evaluator == "self" or (evaluator.startswith("tool:") and len(evaluator) > 5)
    ):
        problems.append(f"{where}: data.confidence.evaluator must be 'self' or 'tool:NAME'")


def _check_http(where: str, data: dict[str, Any], problems: list[str]) -> None:
    if not isinstance(data.get("url"), str) or not data["url"]:
        problems.append(f"{where}: an http connector needs data.url")
    method = data.get("method", "POST")
    if not isinstance(method, str) or method.upper() not in HTTP_METHODS:
        problems.append(f"{where}: data.method must be one of {', '.join(sorted(HTTP_METHODS))}")
    headers = data.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        problems.append(f"{where}: data.headers must be an object of strings")


def _check_email(where: str, data: dict[str, Any], problems: list[str]) -> None:
    if "to" not in data:
        problems.append(f"{where}: an email connector needs data.to, its recipients")
    for field in ("to", "cc"):
        if field in data and not _is_recipients(data[field], empty_ok=field == "cc"):
            problems.append(
                f"{where}: data.{field} must be an address or a list of addresses"
                " (templates allowed)"
            )
    sender = data.get("from")
    if "from" in data and not (isinstance(sender, str) and _is_address(sender)):
        problems.append(f"{where}: data.from must be one address (templates allowed)")
    if not isinstance(data.get("subject"), str):
        problems.append(f"{where}: an email connector needs data.subject, a string")
    parts = [f for f in ("body", "text", "html") if f in data]
    if not parts:
        problems.append(f"{where}: an email connector needs data.body (or data.text) or data.html")
    if "body" in data and "text" in data:
        problems.append(f"{where}: data.body and data.text are the same part: give one")
    for field in parts:
        if not isinstance(data[field], str):
            problems.append(f"{where}: data.{field} must be a string (templates allowed)")


def _is_recipients(value: Any, *, empty_ok: bool) -> bool:
    if isinstance(value, str):
        return _is_address(value)
    return (
        isinstance(value, list)
        and (empty_ok or bool(value))
        and all(isinstance(v, str) and _is_address(v) for v in value)
    )


def _is_address(value: str) -> bool:
    """A template (checked when it renders) or a literal holding an address with an '@'."""
    if "{{" in value or "{%" in value:
        return True
    return "@" in value and "\r" not in value and "\n" not in value


def _check_approval(where: str, data: dict[str, Any], problems: list[str]) -> None:
    if not isinstance(data.get("prompt", ""), str):
        problems.append(f"{where}: data.prompt must be a string (templates allowed)")
    assignees = data.get("assignees", [])
    if not isinstance(assignees, list) or not all(isinstance(a, str) for a in assignees):
        problems.append(f"{where}: data.assignees must be a list of strings")
    if data.get("onTimeout", "reject") not in ("approve", "reject"):
        problems.append(f"{where}: data.onTimeout must be 'approve' or 'reject'")


def _check_retry(where: str, retry: Any, problems: list[str]) -> None:
    if not isinstance(retry, dict):
        problems.append(f"{where}: retry must be an object")
        return
    unknown = set(retry) - {"maxAttempts", "backoffMs", "retryableClasses"}
    if unknown:
        problems.append(f"{where}: retry has unknown fields {', '.join(sorted(map(str, unknown)))}")
    attempts = retry.get("maxAttempts", 1)
    if not _is_int(attempts) or not 1 <= attempts <= 100:
        problems.append(f"{where}: retry.maxAttempts must be an integer from 1 to 100")
    backoff = retry.get("backoffMs", 0)
    if not _is_int(backoff) or backoff < 0:
        problems.append(f"{where}: retry.backoffMs must be a non-negative integer")
    classes = retry.get("retryableClasses", [])
    if not isinstance(classes, list) or not all(
        isinstance(c, str) and c in RETRYABLE_CLASSES for c in classes
    ):
        problems.append(
            f"{where}: retry.retryableClasses must be a list drawn from "
            + ", ".join(sorted(RETRYABLE_CLASSES))
        )


def _check_templates(where: str, value: Any, problems: list[str]) -> None:
    if isinstance(value, str) and ("{{" in value or "{%" in value):
        error = templates.check(value)
        if error is not None:
            problems.append(f"{where}: template {value!r} does not parse: {error}")
    elif isinstance(value, dict):
        for v in value.values():
            _check_templates(where, v, problems)
    elif isinstance(value, list):
        for v in value:
            _check_templates(where, v, problems)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _reachable(start: str, succ: Mapping[str, list[str]]) -> set[str]:
    seen = {start}
    queue = deque([start])
    while queue:
        for nxt in succ[queue.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def _cycle_members(succ: Mapping[str, list[str]]) -> list[str]:
    """Nodes on a cycle, in definition order: the members of strongly connected components
    of more than one node, or with an edge to themselves (Tarjan's algorithm, iterative, so
    linear in nodes and edges and never deeper than the stack allows)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cyclic: set[str] = set()
    for root in succ:
        if root in index:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            targets = succ[node]
            if i < len(targets):
                work.append((node, i + 1))
                t = targets[i]
                if t not in index:
                    work.append((t, 0))
                elif t in on_stack:
                    low[node] = min(low[node], index[t])
                continue
            if work:  # back in the caller: carry the low link up
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in succ[node]:
                    cyclic.update(component)
    return [n for n in succ if n in cyclic]
