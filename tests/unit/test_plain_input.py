"""A plain agent's input as the model's first user message: no key of it is dropped."""

from __future__ import annotations

import json

from lantern.engine.turns import user_message


def test_a_string_or_a_lone_message_is_the_text_itself() -> None:
    assert user_message("hi") == "hi"
    assert user_message({"message": "hi"}) == "hi"


def test_a_message_with_other_keys_is_sent_whole_as_json() -> None:
    sent = user_message({"message": "hi", "a": 1})
    assert json.loads(sent) == {"message": "hi", "a": 1}


def test_any_other_input_is_its_json_text() -> None:
    assert json.loads(user_message({"ticket": 7})) == {"ticket": 7}
    assert json.loads(user_message([1, 2])) == [1, 2]
