"""Edge conditions (``"when": "{{ expression }}"``) and the steps a template names.

A ``when`` is one expression over ``input`` and the outputs of the edge's source and its
ancestors, evaluated in the templates' sandbox; the edge is taken when its value is truthy.
It sees journaled outputs only, so a re-drive takes the same branches. What a template names
(``steps.X``) is read from its syntax tree, so validation can refuse a name that is not an
ancestor before any run starts.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jinja2
from jinja2 import nodes

from lantern.errors import TemplateError
from lantern.nodes import templates

# Parsing only: what a template names does not depend on the sandbox that renders it.
_PARSER = jinja2.Environment(autoescape=False)


def problem(text: Any) -> str | None:
    """Why ``text`` is not a usable ``when`` (one ``{{ expression }}``), or None."""
    if not isinstance(text, str):
        return "'when' must be a string holding one {{ expression }}"
    error = templates.check(text)
    if error is not None:
        return f"'when' {text!r} does not parse: {error}"
    if not templates.is_single(text):
        return f"'when' {text!r} must be exactly one {{{{ expression }}}} and nothing else"
    return None


@functools.lru_cache(maxsize=4096)
def steps_named(text: str) -> frozenset[str]:
    """The step ids a template reads as ``steps.X`` or ``steps['X']`` (empty if it does not
    parse: that is reported on its own)."""
    try:
        tree = _PARSER.parse(text)
    except jinja2.TemplateSyntaxError:
        return frozenset()
    found: set[str] = set()
    for attr in tree.find_all(nodes.Getattr):
        if isinstance(attr.node, nodes.Name) and attr.node.name == "steps":
            found.add(attr.attr)
    for item in tree.find_all(nodes.Getitem):
        key = item.arg
        if isinstance(item.node, nodes.Name) and item.node.name == "steps":
            if isinstance(key, nodes.Const) and isinstance(key.value, str):
                found.add(key.value)
    return frozenset(found)


def strings(value: Any) -> list[str]:
    """Every template string inside a node's data (dicts and lists walked)."""
    if isinstance(value, str):
        return [value] if "{{" in value or "{%" in value else []
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def holds(text: str, scope: dict[str, Any], *, where: str) -> bool:
    """The edge's condition, evaluated; TemplateError (naming ``where``) when it fails."""
    value = templates.render(text, scope, where=where)
    try:
        return bool(value)
    except Exception as exc:  # a value whose truth is undefined
        raise TemplateError(f"template error in {where}: {exc}") from exc
