"""The model layer's pure parts: pricing, routes, error classes, tool schemas, turns."""

from __future__ import annotations

from typing import Any, Literal

import pytest

import lantern
from lantern.engine import turns
from lantern.engine.graph import PlainAgent, parse_agent
from lantern.errors import UsageError
from lantern.models import errors, pricing, router, tools
from lantern.models.records import TokenUsage


def test_prices_come_from_the_table_and_dated_names_take_their_prefix() -> None:
    assert pricing.cost("gpt-4o-mini", TokenUsage(1_000_000, 1_000_000)) == (0.75, True)
    assert pricing.price("gpt-4o-2024-08-06") == pricing.price("gpt-4o")
    assert pricing.price("openai/gpt-4o") == pricing.price("gpt-4o")
    assert pricing.cost("offline/echo", TokenUsage(10, 10)) == (0.0, True)


def test_an_unknown_model_counts_tokens_only_and_says_so() -> None:
    assert pricing.cost("llama3.1:8b", TokenUsage(10, 10)) == (0.0, False)


def test_routes_come_from_configuration() -> None:
    routes = router.configured('{"r": ["gpt-4o-mini", "x"]}', None)
    assert router.candidates("route:r", routes) == ("gpt-4o-mini", "x")
    assert router.candidates("gpt-4o", routes) == ("gpt-4o",)
    with pytest.raises(UsageError, match="unknown model route 'q'"):
        router.candidates("route:q", routes)
    with pytest.raises(UsageError, match="non-empty list"):
        router.configured('{"r": []}', None)


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (400, False),
        (401, False),
        (404, False),
        (408, True),
        (409, True),
        (429, True),
        (500, True),
        (503, True),
        (529, True),
    ],
)
def test_provider_errors_are_llm_class_and_retryable_as_a_provider_means(
    status: int, retryable: bool
) -> None:
    error = errors.status_error("openai", "gpt-4o", status, "the provider's words")
    assert error.error_class == "llm" and error.retryable is retryable
    assert "the provider's words" in str(error) and str(status) in str(error)


def test_a_tool_schema_comes_from_hints_and_docstring() -> None:
    app = lantern.App()

    @app.tool("crm.lookup")
    async def lookup(
        ctx: lantern.ToolContext, id: str, limit: int = 3, kind: Literal["a", "b"] = "a"
    ) -> dict[str, Any]:
        """Find a customer by id."""
        return {}

    tool = app.tools["crm.lookup"]
    spec = tools.spec(tool, "crm_lookup")
    assert spec.name == "crm_lookup" and spec.description == "Find a customer by id."
    params = spec.parameters
    assert params["required"] == ["id"]
    assert params["properties"]["id"] == {"type": "string"}
    assert params["properties"]["limit"] == {"type": "integer", "default": 3}
    assert params["properties"]["kind"]["enum"] == ["a", "b"]
    assert "ctx" not in params["properties"]
    assert tools.validated(tool, {"id": "c-1", "limit": "5"}) == {
        "id": "c-1",
        "limit": 5,
        "kind": "a",
    }
    with pytest.raises(ValueError, match="id"):
        tools.validated(tool, {"limit": 1})


def test_wire_names_are_safe_and_unique() -> None:
    assert tools.wire_names(["crm.lookup", "crm_lookup", "a b"]) == {
        "crm_lookup": "crm.lookup",
        "crm_lookup_2": "crm_lookup",
        "a_b": "a b",
    }


def helper(**fields: Any) -> PlainAgent:
    parsed = parse_agent({"name": "h", "model": "offline/echo", "tools": ["crm.lookup"], **fields})
    assert isinstance(parsed, PlainAgent)
    return parsed


def answer(text: str = "", calls: list[tuple[str, dict[str, Any]]] | None = None) -> dict[str, Any]:
    return {
        "text": text,
        "model": "m",
        "provider": "p",
        "toolCalls": [
            {"id": f"c{k}", "name": n, "arguments": a} for k, (n, a) in enumerate(calls or [])
        ],
    }


def test_turns_follow_from_the_completed_steps_alone() -> None:
    agent = helper()
    assert turns.next_action(agent, {}) == turns.CallModel("llm:1", 1)
    outputs: dict[str, Any] = {
        "llm:1": answer(calls=[("crm_lookup", {"id": "1"}), ("crm_lookup", {"id": "2"})])
    }
    first = turns.next_action(agent, outputs)
    assert isinstance(first, turns.CallTool)
    assert (first.step, first.tool) == ("tool:1:crm.lookup", "crm.lookup")
    outputs["tool:1:crm.lookup"] = {"name": "Ada"}
    second = turns.next_action(agent, outputs)
    assert isinstance(second, turns.CallTool) and second.step == "tool:1:crm.lookup:2"
    outputs["tool:1:crm.lookup:2"] = {"name": "Bo"}
    assert turns.next_action(agent, outputs) == turns.CallModel("llm:2", 2)
    outputs["llm:2"] = answer("done")
    done = turns.next_action(agent, outputs)
    assert isinstance(done, turns.Finish) and done.output["text"] == "done"
    messages = turns.transcript(agent, {"message": "hi"}, outputs)
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert messages[0].content == "hi" and messages[2].tool_call_id == "c0"


def test_max_turns_ends_a_run_that_keeps_calling_tools() -> None:
    agent = helper(maxTurns=1)
    action = turns.next_action(agent, {"llm:1": answer(calls=[("crm_lookup", {})])})
    assert isinstance(action, turns.GiveUp) and action.error["code"] == "max_turns_exceeded"


def test_a_tool_taking_kwargs_gets_every_argument() -> None:
    app = lantern.App()

    @app.tool("note")
    def note(text: str, **more: Any) -> dict[str, Any]:
        return {"text": text, **more}

    tool = app.tools["note"]
    assert tools.validated(tool, {"text": "a", "tag": "b"}) == {"text": "a", "tag": "b"}
    assert tools.spec(tool, "note").parameters["additionalProperties"] is True
