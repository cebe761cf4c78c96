"""Templates (``{{ input.x }}``, ``{{ steps.node.output.y }}``) rendered in Jinja2's sandbox.

A string that is exactly one ``{{ expression }}`` renders to the expression's own value, so
``"{{ input.count }}"`` stays a number; anything else renders to a string.
"""

from __future__ import annotations

import re
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from lantern.errors import TemplateError

_ENV = ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False)
_SINGLE = re.compile(r"^\s*\{\{(?P<expr>(?:(?!\{\{|\}\}).)*)\}\}\s*$", re.S)


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
            expr = _ENV.compile_expression(single.group("expr"), undefined_to_none=False)
            result = expr(**context)
            if isinstance(result, jinja2.Undefined):
                str(result)  # StrictUndefined raises here, naming what is missing
            return result
        return _ENV.from_string(text).render(**context)
    except jinja2.TemplateError as exc:
        place = f" in {where}" if where else ""
        raise TemplateError(f"template error{place}: {exc}") from exc


def check(text: str) -> str | None:
    """The syntax error of a template, or None; used when a definition is applied."""
    try:
        _ENV.parse(text)
    except jinja2.TemplateSyntaxError as exc:
        return str(exc)
    return None
