"""Plain records of a model call: what Lantern asks a provider, and what it answers.

Messages and tool calls also travel through the journal (a plain agent's transcript is its
steps' outputs), so each has a JSON form and is rebuilt from it on a re-drive.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Role = Literal["user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolSpec:
    """A tool as a model sees it: ``name`` is the wire name (letters, digits, ``_``, ``-``)."""

    name: str
    description: str
    parameters: Mapping[str, Any]  # a JSON schema of an object


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str  # the wire name the model used
    arguments: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": dict(self.arguments)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToolCall:
        return cls(str(data["id"]), str(data["name"]), dict(data.get("arguments") or {}))


@dataclass(frozen=True)
class Message:
    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant turn asking for tools
    tool_call_id: str | None = None  # a tool result: the call it answers


@dataclass(frozen=True)
class ModelRequest:
    model: str  # a model name, ``offline/...``, or ``route:NAME``
    messages: tuple[Message, ...]
    idempotency_key: str
    system: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    json: bool = False  # ask for a JSON object as the answer
    tools: tuple[ToolSpec, ...] = ()


@dataclass(frozen=True)
class TokenUsage:
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class ModelResponse:
    """A provider's answer: ``model`` is the name it reports, ``provider`` who answered."""

    text: str
    model: str
    provider: str
    usage: TokenUsage
    tool_calls: tuple[ToolCall, ...] = field(default=())


OnText = Callable[[str], None]


class Provider(Protocol):
    """One model provider. ``complete`` raises StepError(error_class="llm") on failure.

    With ``on_text`` it streams: each piece of the answer's text goes to ``on_text`` as it
    arrives, and the response (text, tool calls, usage) is the same as without.
    """

    name: str

    async def complete(
        self, request: ModelRequest, on_text: OnText | None = None
    ) -> ModelResponse: ...

    async def aclose(self) -> None:
        """Close the provider's connections on the running event loop."""


def tool_calls_json(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    return [c.to_json() for c in calls]
