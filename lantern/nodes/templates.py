"""Templates (``{{ input.x }}``, ``{{ steps.node.output.y }}``) rendered in Jinja2's sandbox.

A string that is exactly one ``{{ expression }}`` renders to the expression's own value, so
``"{{ input.count }}"`` stays a number; anything else renders to a string. The value is a copy:
a tool that changes its arguments never changes the input or the outputs later steps read.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from lantern.errors import TemplateError

_ENV = ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False)
# One ``{{ expression }}`` alone, whitespace-control markers (``{{-``, ``{{+``, ``-}}``) aside.
_SINGLE = re.compile(r"^\s*\{\{[-+]?(?P<expr>(?:(?!\{\{|\}\}).)*?)-?\}\}\s*$", re.S)


def render(value: Any, context: dict[str, Any], *, where: str = "") -> Any:
    """Render every string inside ``value`` (dicts and lists are walked)."""
    if isinstance(value, str):
        return _render_string(value, context, where)
    if isinstance(value, dict):
        return {
            k: render(v, context, where=f"{where}.{k}" if where else k) for k, v in value.items()
        }
    if isinstance(value, list):
        return [render(v, context, where=f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def _render_string(text: str, context: dict[str, Any], where: str) -> Any:
    if "{{" not in text and "{%" not in text:
        return text
    try:
        single = _SINGLE.match(text)
        if single is not None:
            result = _expression(single.group("expr"))(**context)
            if isinstance(result, jinja2.Undefined):
                str(result)  # StrictUndefined raises here, naming what is missing
            return copy.deepcopy(result)
        return _template(text).render(**context)
    except jinja2.TemplateError as exc:
        raise TemplateError(f"template error{_place(where)}: {exc}") from exc
    except Exception as exc:  # the expression itself failed: 1 / 0, 1 + "a", a range too big
        raise TemplateError(f"template error{_place(where)}: {type(exc).__name__}: {exc}") from exc


# A run renders the same few templates over and over; compiling is most of the cost.
@functools.lru_cache(maxsize=4096)
def _expression(source: str) -> Any:
    return _ENV.compile_expression(source, undefined_to_none=False)


@functools.lru_cache(maxsize=4096)
def _template(source: str) -> jinja2.Template:
    return _ENV.from_string(source)


def _place(where: str) -> str:
    return f" in {where}" if where else ""


def is_single(text: str) -> bool:
    """Whether ``text`` is exactly one ``{{ expression }}`` (which renders to its own value)."""
    return _SINGLE.match(text) is not None


def check(text: str) -> str | None:
    """The syntax error of a template, or None; used when a definition is applied."""
    try:
        _ENV.parse(text)
    except jinja2.TemplateSyntaxError as exc:
        return str(exc)
    return None
