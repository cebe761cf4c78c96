"""The checks of a ctx.model call's arguments, shared by an in-process agent and a VM's calls."""

from __future__ import annotations

import pytest

from lantern import App, UsageError
from lantern.engine import call_args
from lantern.models.records import ToolSpec


def app() -> App:
    a = App()
    a.tool("lookup")(lambda account: account)
    a.tool("ledger", workspaces=["acme"])(lambda: None)
    return a


def test_tool_names_and_specs_are_kept_in_order() -> None:
    spec = {"name": "free", "description": "d", "parameters": {"type": "object"}}
    got = call_args.tool_specs(app().tools_for("acme"), ["lookup", spec], missing="here")
    assert got == ("lookup", ToolSpec("free", "d", {"type": "object"}))


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("lookup", "tools must be a list"),
        (["nope"], "no tool 'nope' is registered on the control plane's App"),
        (["ledger"], "no tool 'ledger' is registered"),  # another workspace's
        ([{"description": "no name"}], "tools are tool names or {name, description, parameters}"),
    ],
)
def test_a_bad_tool_list_is_refused_with_what_is_wrong(given: object, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("{", r"\{").replace("}", r"\}")):
        box = app().tools_for("globex")
        call_args.tool_specs(box, given, missing="on the control plane's App")


def test_a_retry_block_is_checked_and_none_is_one_attempt() -> None:
    assert call_args.retry_policy(None, "ctx.step('s')").max_attempts == 1
    assert call_args.retry_policy({"maxAttempts": 3}, "ctx.step('s')").max_attempts == 3
    with pytest.raises(UsageError, match=r"ctx.step\('s'\): retry maxAttempts must be"):
        call_args.retry_policy({"maxAttempts": 0}, "ctx.step('s')")


def test_a_model_call_needs_a_prompt_or_messages_and_a_known_route() -> None:
    with pytest.raises(UsageError, match="give a prompt or messages"):
        call_args.messages(None, [])
    assert [m.role for m in call_args.messages("hi", [{"role": "assistant", "content": "x"}])] == [
        "user",
        "assistant",
    ]
    assert call_args.model_name("offline", {}) == "offline"
    with pytest.raises(UsageError, match="route:fast"):
        call_args.model_name("route:fast", {})
