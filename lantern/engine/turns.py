"""A plain agent's conversation, decided from its journaled steps alone (no I/O here).

Steps are ``llm:N`` (model turn N) and ``tool:N:NAME`` (a tool call of turn N;
``tool:N:NAME:K`` for the K-th call of one tool in one turn). A model turn's output holds its
``toolCalls``; the conversation so far, and so the next step, follow from the outputs of the
steps completed, which is what makes a re-drive replay it exactly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lantern.engine import events as ev
from lantern.engine.graph import PlainAgent
from lantern.models.records import Message, ToolCall
from lantern.models.tools import wire_names


@dataclass(frozen=True)
class CallModel:
    step: str
    turn: int


@dataclass(frozen=True)
class CallTool:
    step: str
    tool: str  # the user's tool name ("" when the model named no tool of the agent)
    call: ToolCall


@dataclass(frozen=True)
class Finish:
    output: dict[str, Any]


@dataclass(frozen=True)
class GiveUp:
    error: dict[str, Any]


Action = CallModel | CallTool | Finish | GiveUp


def llm_step(turn: int) -> str:
    return f"llm:{turn}"


def tool_steps(agent: PlainAgent, turn: int, answer: Mapping[str, Any]) -> list[CallTool]:
    names = wire_names(agent.tools)
    seen: dict[str, int] = {}
    out = []
    for raw in answer.get("toolCalls") or ():
        call = ToolCall.from_json(raw)
        # The tool a call named is journaled with it (older journals: from the agent's list).
        tool = str(raw["tool"]) if "tool" in raw else names.get(call.name, "")
        label = tool or call.name
        seen[label] = seen.get(label, 0) + 1
        suffix = "" if seen[label] == 1 else f":{seen[label]}"
        out.append(CallTool(f"tool:{turn}:{label}{suffix}", tool, call))
    return out


def next_action(agent: PlainAgent, outputs: Mapping[str, Any]) -> Action:
    turn = 1
    while True:
        step = llm_step(turn)
        if step not in outputs:
            return CallModel(step, turn)
        answer = outputs[step]
        calls = tool_steps(agent, turn, answer)
        if not calls:
            return Finish(
                {
                    "text": answer.get("text", ""),
                    "model": answer.get("model"),
                    "provider": answer.get("provider"),
                    "turns": turn,
                }
            )
        if turn >= agent.max_turns:
            return GiveUp(
                ev.run_error(
                    ev.E_MAX_TURNS,
                    f"the model still asked for tools after maxTurns ({turn}) turns",
                    turns=turn,
                )
            )
        for call in calls:
            if call.step not in outputs:
                return call
        turn += 1


def user_message(run_input: Any) -> str:
    """The run's input as the user's message: a string as is, ``{"message": ...}``'s message,
    anything else as JSON text. An object with keys beside ``message`` is anything else: the
    model sees all of it, rather than the other keys being dropped without a word."""
    if isinstance(run_input, str):
        return run_input
    if (
        isinstance(run_input, dict)
        and isinstance(run_input.get("message"), str)
        and run_input.keys() == {"message"}
    ):
        return str(run_input["message"])
    return json.dumps(run_input)


def transcript(agent: PlainAgent, run_input: Any, outputs: Mapping[str, Any]) -> list[Message]:
    """The messages a model sees next: the user's, then each completed turn and tool result."""
    messages = [Message("user", user_message(run_input))]
    turn = 1
    while llm_step(turn) in outputs:
        answer = outputs[llm_step(turn)]
        calls = tool_steps(agent, turn, answer)
        messages.append(Message("assistant", answer.get("text", ""), tuple(c.call for c in calls)))
        for c in calls:
            if c.step in outputs:
                messages.append(
                    Message("tool", json.dumps(outputs[c.step]), tool_call_id=c.call.id)
                )
        turn += 1
    return messages
