"""``offline/tools``: a plain agent's model with no key and no network, answering from the
conversation alone (so a re-sent turn gets the same answer)."""

from __future__ import annotations

import json

from lantern.models.offline import OfflineProvider
from lantern.models.records import Message, ModelRequest, ToolCall, ToolSpec

STATUS = ToolSpec("orders_status", "", {"type": "object", "properties": {"order_id": {}}})
ETA = ToolSpec("orders_eta", "", {"type": "object", "properties": {"order_id": {}, "zone": {}}})


def ask(messages: list[Message], tools: tuple[ToolSpec, ...] = (STATUS, ETA)) -> ModelRequest:
    return ModelRequest("offline/tools", tuple(messages), "key", tools=tools)


async def test_it_calls_each_tool_once_in_order_then_answers_with_their_results() -> None:
    model = OfflineProvider()
    user = Message("user", json.dumps({"order_id": "A-17", "other": 1}))
    first = await model.complete(ask([user]))
    assert first.tool_calls == (ToolCall("call_1", "orders_status", {"order_id": "A-17"}),)
    assert first == await model.complete(ask([user]))  # the same conversation, the same answer
    said = [
        user,
        Message("assistant", "", first.tool_calls),
        Message("tool", '{"status": "shipped"}', tool_call_id="call_1"),
    ]
    second = await model.complete(ask(said))
    assert second.tool_calls == (ToolCall("call_2", "orders_eta", {"order_id": "A-17"}),)
    said += [
        Message("assistant", "", second.tool_calls),
        Message("tool", "not json", tool_call_id="call_2"),
    ]
    last = await model.complete(ask(said))
    assert last.tool_calls == ()
    assert json.loads(last.text) == {
        "orders_status": {"status": "shipped"},
        "orders_eta": "not json",
    }
    assert last.provider == "offline" and last.usage.output_tokens > 0


async def test_a_message_that_is_not_an_object_fills_a_single_parameter_only() -> None:
    model = OfflineProvider()
    one = await model.complete(ask([Message("user", "A-17")], (STATUS,)))
    assert one.tool_calls[0].arguments == {"order_id": "A-17"}
    two = await model.complete(ask([Message("user", "A-17")], (ETA,)))
    assert two.tool_calls[0].arguments == {}
    none = await model.complete(ask([Message("user", "hi")], ()))
    assert none.text == "no tools to call" and none.tool_calls == ()
