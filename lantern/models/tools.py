"""The user's tools as a model sees them: a JSON schema from the type hints, the docstring as
the description, and a wire name the providers accept.

Providers allow only letters, digits, ``_`` and ``-`` in tool names, so ``crm.lookup`` goes
on the wire as ``crm_lookup``; the mapping is a pure function of the agent's tool list, so a
re-drive maps a journaled tool call back to the same tool.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Sequence
from typing import Any, Literal, get_type_hints

import pydantic

from lantern.app import Tool, Toolbox
from lantern.errors import StepError
from lantern.models.records import ToolSpec

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def wire_names(tools: Sequence[str]) -> dict[str, str]:
    """wire name -> tool name, for an agent's tool list (unique, at most 64 characters)."""
    out: dict[str, str] = {}
    for name in tools:
        base = _UNSAFE.sub("_", name)[:60] or "tool"
        wire, k = base, 2
        while wire in out:
            wire, k = f"{base}_{k}", k + 1
        out[wire] = name
    return out


async def offered(box: Toolbox, given: Sequence[str | ToolSpec]) -> tuple[ToolSpec, ...]:
    """What a model step offers for ``given``: each tool name (checked with ``Toolbox.has``
    when the call was made) looked up in the run's ``box`` when the step runs, so an MCP
    server's tool starts its server then (a replayed step needs no server; one that is down
    raises ToolUnavailable, so the step fails retryable), and each spec as it is."""
    names = [t for t in given if isinstance(t, str)]
    wires = {name: wire for wire, name in wire_names(names).items()}
    out: list[ToolSpec] = []
    for t in given:
        if isinstance(t, ToolSpec):
            out.append(t)
            continue
        found = await box.find(t)
        if found is None:
            raise StepError(f"tool {t!r}: its MCP server has no such tool", error_class="tool")
        out.append(spec(found, wires[t]))
    return tuple(out)


@functools.cache
def arguments_model(tool: Tool) -> type[pydantic.BaseModel]:
    """A pydantic model of the tool's keyword arguments (its context parameter left out)."""
    try:
        hints = get_type_hints(tool.fn)
    except Exception:  # unresolvable annotations: take every argument as any JSON
        hints = {}
    fields: dict[str, Any] = {}
    params = inspect.signature(tool.fn).parameters.values()
    # A tool taking **kwargs takes any further argument too.
    extra: Literal["allow", "ignore"] = (
        "allow" if any(p.kind is p.VAR_KEYWORD for p in params) else "ignore"
    )
    for param in params:
        if param.name == tool.context_param or param.kind in (
            param.VAR_POSITIONAL,
            param.VAR_KEYWORD,
        ):
            continue
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, default)
    return pydantic.create_model(
        f"{_UNSAFE.sub('_', tool.name)}_arguments",
        __config__=pydantic.ConfigDict(extra=extra),
        **fields,
    )


def spec(tool: Tool, wire: str) -> ToolSpec:
    if tool.schema is not None:  # its own schema (an MCP server's tool)
        return ToolSpec(wire, tool.description or f"The tool {tool.name}.", dict(tool.schema))
    schema = arguments_model(tool).model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return ToolSpec(wire, tool.description or f"The tool {tool.name}.", schema)


def validated(tool: Tool, arguments: dict[str, Any]) -> dict[str, Any]:
    """The model's arguments checked (and coerced) against the tool's hints; raises
    ValueError with pydantic's explanation when they do not fit. A tool with its own schema
    (an MCP server's) gets them as they are: its server checks them."""
    if tool.schema is not None:
        return dict(arguments)
    try:
        model = arguments_model(tool).model_validate(arguments)
    except pydantic.ValidationError as exc:
        raise ValueError(str(exc)) from exc
    values = {name: getattr(model, name) for name in type(model).model_fields}
    return {**values, **(model.model_extra or {})}
