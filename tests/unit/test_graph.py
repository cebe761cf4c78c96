"""Agent definitions: every bad definition names its nodes, and all problems come together."""

from __future__ import annotations

from typing import Any

import pytest

from lantern.engine.graph import Graph, PlainAgent, parse_agent
from lantern.errors import DefinitionError, UsageError

START = {"id": "start", "type": "trigger"}


def tool(node_id: str, **data: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "tool", "data": {"tool": "crm.lookup", **data}}


def http(node_id: str, **data: Any) -> dict[str, Any]:
    return {
        "id": node_id,
        "type": "connector",
        "data": {"connector": "http", "url": "https://example.test/hook", **data},
    }


def mail(node_id: str, **data: Any) -> dict[str, Any]:
    fields = {"connector": "email", "to": "{{ input.email }}", "subject": "Hi", "body": "Hello"}
    return {"id": node_id, "type": "connector", "data": {**fields, **data}}


def edge(source: Any, target: Any) -> dict[str, Any]:
    return {"source": source, "target": target}


def agent(nodes: list[Any], edges: list[Any], name: str = "a") -> dict[str, Any]:
    return {"name": name, "graph": {"nodes": nodes, "edges": edges}}


def fan_out(*nodes: dict[str, Any]) -> dict[str, Any]:
    """start -> each node: a graph valid in every way but the nodes themselves."""
    return agent([START, *nodes], [edge("start", n["id"]) for n in nodes])


def problems_of(definition: Any) -> list[str]:
    with pytest.raises(DefinitionError) as info:
        parse_agent(definition)
    return info.value.problems


def one_problem(definition: Any) -> str:
    problems = problems_of(definition)
    assert len(problems) == 1, problems
    return problems[0]


# ---------------------------------------------------------------- a valid definition


def test_the_email_connector_of_the_contract_example_parses() -> None:
    node = {
        "id": "mail",
        "type": "connector",
        "data": {
            "connector": "email",
            "to": "{{ input.email }}",
            "subject": "Hi",
            "body": "{{ input.text }}",
        },
    }
    g = parse_agent(fan_out(node))
    assert isinstance(g, Graph)
    assert g.nodes["mail"].data["connector"] == "email"


@pytest.mark.parametrize(
    "data",
    [
        {"to": "ada@example.test"},
        {"to": "Ada <ada@example.test>, bob@example.test"},
        {"to": ["ada@example.test", "{{ input.boss }}"], "cc": []},
        {"cc": ["c@example.test"], "from": "Lantern <noreply@example.test>"},
        {"cc": "{{ input.cc }}", "from": "{{ input.sender }}"},
        {"html": "<p>hi</p>"},
        {"body": None, "html": "<p>{{ input.name }}</p>"},
        {"body": None, "text": "plain", "html": "<b>hi</b>", "timeoutMs": 5000},
        {"subject": "{{ steps.start.output.subject }}", "body": "{{ input.text }}"},
    ],
)
def test_valid_email_connectors_parse(data: dict[str, Any]) -> None:
    node = mail("m", **data)
    node["data"] = {k: v for k, v in node["data"].items() if v is not None}  # None: left out
    g = parse_agent(fan_out(node))
    assert isinstance(g, Graph)
    assert g.nodes["m"].data == node["data"]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"to": None}, "node 'm': data.to must be an address or a list of addresses"),
        ({"to": []}, "node 'm': data.to must be an address or a list of addresses"),
        ({"to": "nobody"}, "node 'm': data.to must be an address or a list of addresses"),
        ({"to": ["a@b.c", 7]}, "node 'm': data.to must be an address or a list of addresses"),
        ({"to": "a@b.c\r\nBcc: x@y.z"}, "node 'm': data.to must be an address"),
        ({"cc": "nobody"}, "node 'm': data.cc must be an address or a list of addresses"),
        ({"cc": {"a": "a@b.c"}}, "node 'm': data.cc must be an address or a list of addresses"),
        ({"from": ["a@b.c"]}, "node 'm': data.from must be one address"),
        ({"from": "lantern"}, "node 'm': data.from must be one address"),
        ({"subject": None}, "node 'm': an email connector needs data.subject, a string"),
        ({"subject": 3}, "node 'm': an email connector needs data.subject, a string"),
        ({"body": {"text": "x"}}, "node 'm': data.body must be a string"),
        ({"html": ["<p>"]}, "node 'm': data.html must be a string"),
        ({"text": "also"}, "node 'm': data.body and data.text are the same part: give one"),
        ({"timeoutMs": 0}, "node 'm': data.timeoutMs must be a positive integer"),
        ({"timeoutMs": "5s"}, "node 'm': data.timeoutMs must be a positive integer"),
        ({"subject": "{{ input.x "}, "node 'm': template '{{ input.x ' does not parse"),
    ],
)
def test_email_connector_problems_name_the_node(data: dict[str, Any], expected: str) -> None:
    assert one_problem(fan_out(mail("m", **data))).startswith(expected)


def test_an_email_connector_needs_recipients_subject_and_a_body() -> None:
    node = {"id": "m", "type": "connector", "data": {"connector": "email"}}
    assert problems_of(fan_out(node)) == [
        "node 'm': an email connector needs data.to, its recipients",
        "node 'm': an email connector needs data.subject, a string",
        "node 'm': an email connector needs data.body (or data.text) or data.html",
    ]


def test_a_valid_diamond_parses_with_its_structure() -> None:
    g = parse_agent(
        agent(
            [START, tool("a"), http("b", method="get"), tool("c"), tool("d")],
            [
                edge("start", "a"),
                edge("start", "b"),
                edge("a", "c"),
                edge("b", "c"),
                edge("start", "d"),
            ],
            name="diamond",
        )
    )
    assert isinstance(g, Graph)
    assert g.name == "diamond"
    assert g.trigger == "start"
    assert list(g.nodes) == ["start", "a", "b", "c", "d"]  # definition order
    assert g.nodes["b"].type == "connector"
    assert g.nodes["a"].data["tool"] == "crm.lookup"
    assert dict(g.predecessors) == {
        "start": (),
        "a": ("start",),
        "b": ("start",),
        "c": ("a", "b"),
        "d": ("start",),
    }
    assert dict(g.successors) == {
        "start": ("a", "b", "d"),
        "a": ("c",),
        "b": ("c",),
        "c": (),
        "d": (),
    }
    assert g.sinks == ("c", "d")


def test_a_trigger_alone_is_a_valid_graph_and_its_own_sink() -> None:
    g = parse_agent(agent([START], []))
    assert isinstance(g, Graph)
    assert g.sinks == ("start",)
    assert g.predecessors["start"] == ()


def test_the_parsed_graph_is_read_only() -> None:
    g = parse_agent(fan_out(tool("a")))
    assert isinstance(g, Graph)
    with pytest.raises(TypeError):
        g.nodes["x"] = g.nodes["a"]  # type: ignore[index]
    with pytest.raises(TypeError):
        g.nodes["a"].data["tool"] = "other"  # type: ignore[index]


def test_a_valid_definition_with_retry_and_templates_parses() -> None:
    g = parse_agent(
        fan_out(
            tool(
                "a",
                args={"id": "{{ input.id }}", "note": "hi {{ input.name | upper }}"},
                retry={"maxAttempts": 3, "backoffMs": 500, "retryableClasses": ["tool"]},
            )
        )
    )
    assert isinstance(g, Graph)
    assert g.nodes["a"].data["retry"]["maxAttempts"] == 3


def test_an_edge_listed_twice_is_one_edge() -> None:
    g = parse_agent(agent([START, tool("a")], [edge("start", "a"), edge("start", "a")]))
    assert isinstance(g, Graph)
    assert g.predecessors["a"] == ("start",)
    assert g.successors["start"] == ("a",)


# ---------------------------------------------------------------- one problem each


def test_definition_error_is_a_usage_error_listing_its_problems() -> None:
    with pytest.raises(UsageError) as info:
        parse_agent(fan_out({"id": "x", "type": "magic"}))
    assert isinstance(info.value, DefinitionError)
    assert str(info.value).startswith("invalid agent definition: ")
    assert "'x'" in str(info.value)


def test_unknown_node_type_names_the_node_and_the_type() -> None:
    problem = one_problem(fan_out({"id": "weird", "type": "magic"}))
    assert "'weird'" in problem
    assert "unknown node type 'magic'" in problem
    assert "tool" in problem and "connector" in problem  # the known types are listed


def test_duplicate_id_names_the_node() -> None:
    problem = one_problem(agent([START, tool("a"), tool("a")], [edge("start", "a")]))
    assert problem == "node 'a': duplicate id"


def test_edge_to_a_missing_target_names_it() -> None:
    problem = one_problem(agent([START, tool("a")], [edge("start", "a"), edge("a", "ghost")]))
    assert "target node 'ghost' does not exist" in problem
    assert "a -> ghost" in problem


def test_edge_from_a_missing_source_names_it() -> None:
    problem = one_problem(agent([START, tool("a")], [edge("start", "a"), edge("nowhere", "a")]))
    assert "source node 'nowhere' does not exist" in problem
    assert "nowhere -> a" in problem


def test_edge_with_both_ends_missing_names_both() -> None:
    problems = problems_of(agent([START, tool("a")], [edge("start", "a"), edge("x", "y")]))
    assert any("source node 'x'" in p for p in problems)
    assert any("target node 'y'" in p for p in problems)


def test_edge_ends_that_are_not_strings_are_problems_not_crashes() -> None:
    problems = problems_of(agent([START, tool("a")], [edge("start", "a"), edge(["x"], {"y": 1})]))
    assert any("source node ['x'] does not exist" in p for p in problems)
    assert any("target node {'y': 1} does not exist" in p for p in problems)


def test_no_trigger() -> None:
    problem = one_problem(agent([tool("a"), tool("b")], [edge("a", "b")]))
    assert "no trigger" in problem


def test_more_than_one_trigger_names_them() -> None:
    problem = one_problem(
        agent(
            [START, {"id": "again", "type": "trigger"}, tool("a")],
            [edge("start", "a"), edge("again", "a")],
        )
    )
    assert "more than one trigger" in problem
    assert "start" in problem and "again" in problem


def test_a_trigger_with_incoming_edges() -> None:
    problems = problems_of(agent([START, tool("a")], [edge("start", "a"), edge("a", "start")]))
    assert "node 'start': a trigger cannot have incoming edges" in problems


def test_a_cycle_names_exactly_the_nodes_on_it() -> None:
    # start -> a -> b -> a, and b -> c: c is downstream of the cycle, not on it
    problem = one_problem(
        agent(
            [START, tool("a"), tool("b"), tool("c")],
            [edge("start", "a"), edge("a", "b"), edge("b", "a"), edge("b", "c")],
        )
    )
    assert "cycle" in problem
    assert problem.endswith("nodes a, b")


def test_a_self_loop_is_a_cycle() -> None:
    problem = one_problem(agent([START, tool("a")], [edge("start", "a"), edge("a", "a")]))
    assert "cycle" in problem and problem.endswith("nodes a")


def test_an_unreachable_node_is_named() -> None:
    problem = one_problem(agent([START, tool("a"), tool("lonely")], [edge("start", "a")]))
    assert problem == "node 'lonely': unreachable from the trigger 'start'"


@pytest.mark.parametrize(
    ("retry", "expected"),
    [
        ({"maxAttempts": 0}, "retry.maxAttempts must be an integer from 1 to 100"),
        ({"maxAttempts": 101}, "retry.maxAttempts must be an integer from 1 to 100"),
        ({"maxAttempts": "3"}, "retry.maxAttempts must be an integer from 1 to 100"),
        ({"maxAttempts": 2.5}, "retry.maxAttempts must be an integer from 1 to 100"),
        ({"maxAttempts": True}, "retry.maxAttempts must be an integer from 1 to 100"),
        ({"backoffMs": -1}, "retry.backoffMs must be a non-negative integer"),
        ({"retryableClasses": ["bogus"]}, "retry.retryableClasses must be a list drawn from"),
        ({"retryableClasses": "llm"}, "retry.retryableClasses must be a list drawn from"),
        ({"retryableClasses": [["llm"]]}, "retry.retryableClasses must be a list drawn from"),
        ({"maxAttemps": 2}, "retry has unknown fields maxAttemps"),
        ({1: 2, "x": 3}, "retry has unknown fields 1, x"),
        ([1], "retry must be an object"),
    ],
)
def test_an_invalid_retry_block(retry: Any, expected: str) -> None:
    problem = one_problem(fan_out(tool("flaky", retry=retry)))
    assert problem.startswith("node 'flaky': ")
    assert expected in problem


def test_a_plain_llm_agent_parses_with_defaults() -> None:
    parsed = parse_agent({"name": "helper", "model": "claude-haiku-4-5", "tools": ["crm.lookup"]})
    assert isinstance(parsed, PlainAgent)
    assert (parsed.model, parsed.tools, parsed.max_turns) == (
        "claude-haiku-4-5",
        ("crm.lookup",),
        10,
    )


def test_a_bad_plain_llm_agent_reports_every_problem() -> None:
    problems = problems_of(
        {"name": "helper", "model": "", "tools": "x", "maxTurns": 0, "budget": {"maxUsd": -1}}
    )
    assert len(problems) == 4, problems
    assert any("needs a model" in p for p in problems)
    assert any("tools must be a list" in p for p in problems)
    assert any("maxTurns must be an integer from 1 to 100" in p for p in problems)
    assert any("budget.maxUsd must be a non-negative number" in p for p in problems)


def test_an_ai_step_node_is_validated() -> None:
    node = {
        "id": "draft",
        "type": "ai-step",
        "data": {"model": "offline/echo", "prompt": 3, "responseFormat": "xml"},
    }
    problems = problems_of(fan_out(node))
    assert "node 'draft': an ai-step needs data.prompt, a string (templates allowed)" in problems
    assert "node 'draft': data.responseFormat must be 'text' or 'json'" in problems


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (
            tool("t", args={"id": "{{ input.id "}),
            "node 't': template '{{ input.id ' does not parse",
        ),
        (
            tool("t", args={"l": ["ok", "{% if %}x"]}),
            "node 't': template '{% if %}x' does not parse",
        ),
        (http("h", body={"text": "{{ }}"}), "node 'h': template '{{ }}' does not parse"),
        (http("h", url="https://x.test/{{ input.id )}}"), "node 'h': template"),
    ],
)
def test_template_syntax_errors_name_the_node(node: dict[str, Any], expected: str) -> None:
    assert one_problem(fan_out(node)).startswith(expected)


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ({"id": "t", "type": "tool"}, "node 't': a tool node needs data.tool"),
        (tool("t", args=[1]), "node 't': data.args must be an object"),
        (http("h", url=""), "node 'h': an http connector needs data.url"),
        (http("h", method="FETCH"), "node 'h': data.method must be one of"),
        (http("h", headers={"X-N": 1}), "node 'h': data.headers must be an object of strings"),
        (
            {"id": "h", "type": "connector", "data": {"connector": "ftp"}},
            "node 'h': unknown connector 'ftp' (known: email, http)",
        ),
        ({"id": "t", "type": "tool", "data": "x"}, "node 't': 'data' must be an object"),
        ({"id": "t", "type": ["tool"]}, "node 't': 'type' must be a string"),
    ],
)
def test_node_data_problems_name_the_node(node: dict[str, Any], expected: str) -> None:
    assert any(p.startswith(expected) for p in problems_of(fan_out(node)))


@pytest.mark.parametrize(
    ("definition", "expected"),
    [
        ([], "the definition must be a JSON object"),
        ({"graph": {"nodes": [START], "edges": []}}, "name must be"),
        ({"name": "has space", "graph": {"nodes": [START], "edges": []}}, "name must be"),
        ({"name": "a"}, "a definition needs a 'graph'"),
        ({"name": "a", "graph": []}, "graph must be an object"),
        ({"name": "a", "graph": {"nodes": [], "edges": []}}, "graph.nodes must be a non-empty"),
        ({"name": "a", "graph": {"nodes": [START], "edges": {}}}, "graph.edges must be a list"),
        (agent([START, "x"], []), "node 1: must be an object"),
        (agent([START, {"type": "tool"}], []), "node 1: 'id' must be a non-empty string"),
        (agent([START], ["x"]), "edge 0: must be an object"),
    ],
)
def test_malformed_definitions(definition: Any, expected: str) -> None:
    assert any(expected in p for p in problems_of(definition))


# ---------------------------------------------------------------- all together


def test_every_problem_is_reported_in_one_error() -> None:
    definition = agent(
        [
            START,
            tool("a"),
            tool("a"),  # duplicate
            {"id": "weird", "type": "magic"},  # unknown type, and unreachable
            tool("flaky", retry={"maxAttempts": 0, "jitter": True}),  # two retry problems
            {"id": "draft", "type": "ai-step", "data": {"prompt": "{{ input.x "}},
            tool("loop1"),
            tool("loop2"),
        ],
        [
            edge("start", "a"),
            edge("a", "ghost"),
            edge("start", "flaky"),
            edge("start", "draft"),
            edge("loop1", "loop2"),
            edge("loop2", "loop1"),
        ],
        name="many",
    )
    with pytest.raises(DefinitionError) as info:
        parse_agent(definition)
    problems = info.value.problems
    expected = [
        "node 'a': duplicate id",
        "node 'weird': unknown node type 'magic'",
        "node 'flaky': retry has unknown fields jitter",
        "node 'flaky': retry.maxAttempts must be an integer from 1 to 100",
        "node 'draft': needs a model (a model name, offline/..., or route:NAME)",
        "node 'draft': template '{{ input.x ' does not parse",
        "target node 'ghost' does not exist",
        "the graph has a cycle through nodes loop1, loop2",
        "node 'weird': unreachable from the trigger 'start'",
        "node 'loop1': unreachable from the trigger 'start'",
        "node 'loop2': unreachable from the trigger 'start'",
    ]
    for text in expected:
        assert sum(text in p for p in problems) == 1, (text, problems)
    assert len(problems) == len(expected), problems
    message = str(info.value)
    assert "\n" not in message
    for text in expected:
        assert text in message


def test_no_trigger_and_a_bad_node_are_reported_together() -> None:
    problems = problems_of(agent([tool("a"), {"id": "b", "type": "magic"}], [edge("a", "b")]))
    assert any("no trigger" in p for p in problems)
    assert any(p.startswith("node 'b': unknown node type") for p in problems)


def test_a_bad_name_and_a_bad_graph_are_reported_together() -> None:
    problems = problems_of(agent([tool("a")], [], name=""))
    assert any(p.startswith("name must be") for p in problems)
    assert any("no trigger" in p for p in problems)


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ({"id": "ok", "type": "approval", "data": {"prompt": 3}}, "data.prompt must be a string"),
        (
            {"id": "ok", "type": "approval", "data": {"assignees": "ada"}},
            "data.assignees must be a list of strings",
        ),
        (
            {"id": "ok", "type": "approval", "data": {"timeoutMs": 10, "onTimeout": "maybe"}},
            "data.onTimeout must be 'approve' or 'reject'",
        ),
        ({"id": "ok", "type": "approval", "data": {"timeoutMs": 0}}, "data.timeoutMs must be"),
        ({"id": "c", "type": "subagent", "data": {}}, "a subagent node needs data.agentName"),
        ({"id": "s", "type": "signal", "data": {}}, "a signal node needs data.name"),
        ({"id": "s", "type": "signal", "data": {"name": "a b"}}, "a signal node needs data.name"),
        (
            {"id": "s", "type": "signal", "data": {"name": "pay", "timeoutMs": -1}},
            "data.timeoutMs must be",
        ),
    ],
)
def test_an_invalid_approval_subagent_or_signal_node(node: dict[str, Any], expected: str) -> None:
    problem = one_problem(fan_out(node))
    assert expected in problem


def test_only_an_edge_out_of_an_approval_may_carry_a_decision() -> None:
    definition = fan_out(tool("a"))
    definition["graph"]["edges"][0]["on"] = "approved"
    assert "only an edge out of an approval node may have 'on'" in one_problem(definition)


def test_edges_out_of_an_approval_are_taken_on_their_decision() -> None:
    graph = parse_agent(
        {
            "name": "gate",
            "graph": {
                "nodes": [
                    {"id": "start", "type": "trigger"},
                    {"id": "ok", "type": "approval"},
                    tool("send"),
                    tool("apologise"),
                ],
                "edges": [
                    {"source": "start", "target": "ok"},
                    {"source": "ok", "target": "send"},
                    {"source": "ok", "target": "apologise", "on": "rejected"},
                ],
            },
        }
    )
    assert isinstance(graph, Graph)
    assert graph.conditions == {("ok", "send"): "approved", ("ok", "apologise"): "rejected"}
