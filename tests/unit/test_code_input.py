"""A code-first run's input against its function's signature: arguments, or one clear line."""

from __future__ import annotations

from typing import Any

import pytest

import lantern
from lantern.engine.code_input import arguments
from lantern.errors import UsageError

app = lantern.App()


@app.agent("research")
async def research(ctx: lantern.Context, topic: str, depth: int = 2) -> dict[str, Any]:
    return {}


@app.agent("anything")
async def anything(ctx: lantern.Context, **input: Any) -> dict[str, Any]:
    return {}


@app.agent("whole")
def whole(ctx: lantern.Context, input: Any) -> Any:
    return input


@app.agent("bare")
async def bare(ctx: lantern.Context) -> None:
    return None


def test_object_keys_are_keyword_arguments_with_defaults() -> None:
    assert arguments(app.agents["research"], {"topic": "owls"}) == {"topic": "owls", "depth": 2}
    assert arguments(app.agents["research"], {"topic": "owls", "depth": 5})["depth"] == 5


def test_kwargs_take_any_object_and_a_non_object_goes_to_input() -> None:
    assert arguments(app.agents["anything"], {"a": 1, "b": [2]}) == {"a": 1, "b": [2]}
    assert arguments(app.agents["whole"], [1, 2, 3]) == {"input": [1, 2, 3]}
    assert arguments(app.agents["whole"], "text") == {"input": "text"}
    assert arguments(app.agents["bare"], None) == {}


@pytest.mark.parametrize(
    ("agent", "given", "says"),
    [
        ("research", {}, "agent 'research': the input needs 'topic'"),
        ("research", {"topic": "x", "colour": 1}, "takes no argument 'colour'"),
        ("research", {"topic": "x", "depth": "deep"}, "'depth': Input should be a valid integer"),
        ("research", [1], "send a JSON object"),
        ("research", None, "the input needs 'topic'"),
        ("bare", {"x": 1}, "takes no argument 'x'"),
    ],
)
def test_a_bad_input_is_one_line_naming_the_problem(agent: str, given: Any, says: str) -> None:
    with pytest.raises(UsageError) as info:
        arguments(app.agents[agent], given)
    assert says in str(info.value)
    assert "\n" not in str(info.value)
