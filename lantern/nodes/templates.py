"""Templates (``{{ input.x }}``, ``{{ steps.node.output.y }}``) rendered in Jinja2's sandbox.

A string that is exactly one ``{{ expression }}`` renders to the expression's own value, so
``"{{ input.count }}"`` stays a number; anything else renders to a string. The value is a copy:
a tool that changes its arguments never changes the input or the outputs later steps read.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import re
from typing import Any
from urllib.parse import quote

import jinja2
import markupsafe

from lantern.errors import TemplateError
from lantern.sandbox import LimitedEnvironment, Opaque, budgeted, render_bounded

# The sandbox with a bounded cost: output size, steps, big powers (lantern/sandbox.py).
_ENV = LimitedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False)
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


def render_html(value: Any, context: dict[str, Any], *, where: str = "") -> Any:
    """An HTML template: every interpolated value is HTML-escaped unless marked ``|safe``."""
    if not isinstance(value, str) or ("{{" not in value and "{%" not in value):
        return value
    try:
        return render_bounded(_html_template(value), context)
    except jinja2.TemplateError as exc:
        raise TemplateError(f"template error{_place(where)}: {exc}") from exc
    except Exception as exc:
        raise TemplateError(f"template error{_place(where)}: {type(exc).__name__}: {exc}") from exc


_HTML_ENV = LimitedEnvironment(undefined=jinja2.StrictUndefined, autoescape=True)


@functools.lru_cache(maxsize=1024)
def _html_template(source: str) -> jinja2.Template:
    return _HTML_ENV.from_string(source)


def render_url(value: Any, context: dict[str, Any], *, where: str = "") -> Any:
    """A URL template: a value interpolated into it is percent-encoded (``/``, ``?``, ``#``
    and ``@`` too), so input cannot change the host, the path's shape or the query. A value
    that begins the URL (``{{ input.base }}/hook``) is the base URL itself and is kept as is,
    as is a value marked ``|safe``; where either points is the egress policy's to check."""
    if not isinstance(value, str) or _SINGLE.match(value) is not None:
        return render(value, context, where=where)
    if "{{" not in value and "{%" not in value:
        return value
    if "\x00" in value:
        raise TemplateError(f"template error{_place(where)}: a NUL character in a URL")
    values: list[Any] = []

    def substitute(match: re.Match[str]) -> str:
        item = values[int(match.group(1))]
        if match.start() == 0 or isinstance(item, markupsafe.Markup):
            return str(item)
        return quote(str(item), safe="")

    token = _URL_VALUES.set(values)
    try:
        # The substitution too: whatever fails while the URL is made fails the render.
        return _MARK.sub(substitute, render_bounded(_url_template(value), context))
    except jinja2.TemplateError as exc:
        raise TemplateError(f"template error{_place(where)}: {exc}") from exc
    except Exception as exc:
        raise TemplateError(f"template error{_place(where)}: {type(exc).__name__}: {exc}") from exc
    finally:
        _URL_VALUES.reset(token)


# Each value a URL template prints becomes a mark; render_url then decides, by where the
# mark landed, whether to percent-encode it. The list is per render (a context variable).
_URL_VALUES: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "lantern_url_values", default=None
)
_MARK = re.compile("\x00(\\d+)\x00")


def _mark(value: Any) -> Any:
    if isinstance(value, jinja2.Undefined):
        str(value)  # StrictUndefined raises here, inside the render, naming what is missing
    values = _URL_VALUES.get()
    if values is None:
        return value
    values.append(value)
    return f"\x00{len(values) - 1}\x00"


_URL_ENV = LimitedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False, finalize=_mark)


@functools.lru_cache(maxsize=1024)
def _url_template(source: str) -> jinja2.Template:
    return _URL_ENV.from_string(source)


def _render_string(text: str, context: dict[str, Any], where: str) -> Any:
    if "{{" not in text and "{%" not in text:
        return text
    try:
        single = _SINGLE.match(text)
        if single is not None:
            expression = _expression(single.group("expr"))
            result = budgeted(lambda: expression(**context))
            if isinstance(result, jinja2.Undefined):
                str(result)  # StrictUndefined raises here, naming what is missing
            if "secrets" in context:
                result = _inserted(result)
            return copy.deepcopy(result)
        return render_bounded(_template(text), context)
    except jinja2.TemplateError as exc:
        raise TemplateError(f"template error{_place(where)}: {exc}") from exc
    except Exception as exc:  # the expression itself failed: 1 / 0, 1 + "a", a range too big
        raise TemplateError(f"template error{_place(where)}: {type(exc).__name__}: {exc}") from exc


def _inserted(value: Any) -> Any:
    """A single expression's value with each secret in it inserted as it is (its value)."""
    if isinstance(value, Opaque):
        return str(value)
    if isinstance(value, dict):
        return {k: _inserted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_inserted(v) for v in value]
    return value


def names_secrets(text: str) -> bool:
    """Whether a template reads ``secrets`` (False for one that does not parse)."""
    if "secrets" not in text:
        return False
    try:
        parsed = _ENV.parse(text)
    except jinja2.TemplateSyntaxError:
        return False
    return any(n.name == "secrets" for n in parsed.find_all(jinja2.nodes.Name))


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
