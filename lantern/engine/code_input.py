"""A code-first run's input as its function's keyword arguments, checked against the signature.

The input object's keys are the keyword arguments (after the context); a non-object input is
passed as the parameter ``input``. The check runs when a run is created (a bad input is a 422
at ``POST /v1/runs`` and nothing is stored) and again when the run is driven, so a run
created by a replica that did not have the function fails with the same one line.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, get_type_hints

import pydantic

from lantern.app import CodeAgent
from lantern.errors import UsageError

_SKIP = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


@functools.cache
def _model(agent: CodeAgent) -> tuple[type[pydantic.BaseModel], bool]:
    """A pydantic model of the function's keyword parameters, and whether it takes **kwargs."""
    try:
        hints = get_type_hints(agent.fn)
    except Exception:  # unresolvable annotations: take every argument as any JSON
        hints = {}
    params = list(inspect.signature(agent.fn).parameters.values())[1:]
    fields: dict[str, Any] = {}
    for p in params:
        if p.kind in _SKIP:
            continue
        if p.kind is p.POSITIONAL_ONLY:
            raise UsageError(
                f"agent {agent.name!r}: parameter {p.name!r} is positional-only; the input"
                " is passed by keyword"
            )
        fields[p.name] = (hints.get(p.name, Any), ... if p.default is p.empty else p.default)
    extra = any(p.kind is p.VAR_KEYWORD for p in params)
    model = pydantic.create_model(
        "agent_input",
        __config__=pydantic.ConfigDict(extra="allow" if extra else "forbid"),
        **fields,
    )
    return model, extra


def arguments(agent: CodeAgent, run_input: Any) -> dict[str, Any]:
    """The keyword arguments to call ``agent.fn`` with, or a UsageError in one line."""
    model, _ = _model(agent)
    if isinstance(run_input, dict):
        given = run_input
    elif "input" in model.model_fields:
        given = {"input": run_input}
    elif run_input is None:  # no input at all: the function's defaults, if it has them
        given = {}
    else:
        raise UsageError(
            f"agent {agent.name!r} takes its input as keyword arguments: send a JSON object"
            f" (or give the function a parameter named 'input'), not {_json_type(run_input)}"
        )
    try:
        checked = model.model_validate(given)
    except pydantic.ValidationError as exc:
        raise UsageError(f"agent {agent.name!r}: {_problems(exc)}") from None
    values = {name: getattr(checked, name) for name in type(checked).model_fields}
    return {**values, **(checked.model_extra or {})}


def _problems(exc: pydantic.ValidationError) -> str:
    out = []
    for e in exc.errors():
        where = ".".join(str(p) for p in e["loc"]) or "input"
        if e["type"] == "missing":
            out.append(f"the input needs {where!r}")
        elif e["type"] == "extra_forbidden":
            out.append(f"the function takes no argument {where!r}")
        else:
            out.append(f"{where!r}: {e['msg']}")
    return "; ".join(out)


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "null" if value is None else type(value).__name__
