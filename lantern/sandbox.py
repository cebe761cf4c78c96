"""Jinja2's immutable sandbox with a bounded cost (docs/security.md).

A template is a tenant's program run on the event loop every tenant shares, and the sandbox
alone bounds what it may touch, not what it may cost: ``'a' * 200000000`` allocates 200 MB,
``7 ** (9 ** 7)`` is seconds of big-number arithmetic, and nested loops run for ever. Each
render here has a budget:

- **output**: no string or list it makes may pass MAX_OUTPUT characters (or items): ``*``,
  ``**``, ``+``, ``%`` and ``~`` are checked before they compute, and so are the size
  arguments of filters and string methods (``center(10**9)``, ``'{:>999999999}'.format``);
- **steps**: every loop iteration and every call (macros, methods, filters, ``range``) costs
  one of MAX_STEPS, so a loop in a loop in a loop stops after a bounded number of steps;
- **depth**: recursion is Python's, stopped by RecursionError.

A render that would pass a limit fails with TemplateLimit, naming it. Under these limits the
worst render measured costs milliseconds, so rendering stays on the loop (bench/templates.py).
"""

from __future__ import annotations

import contextvars
import functools
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NoReturn

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

MAX_OUTPUT = 1_000_000  # characters a render (or any string it builds) may hold
MAX_ITEMS = 100_000  # items any list it builds may hold
MAX_STEPS = 25_000  # loop iterations plus calls, per render
MAX_POWER_BITS = 4096  # ``a ** b`` may make an integer of at most this many bits


class TemplateLimit(jinja2.TemplateRuntimeError):
    """A render that would pass a cost limit."""


class OpaqueMisuse(jinja2.TemplateRuntimeError):
    """A template did something to an opaque value other than insert it."""


class Opaque:
    """A value a template may insert as it is and do nothing else with (a secret): any
    filter, test, slice, attribute, operator, call or comparison applied to it, or to a
    list or mapping that holds it, fails the render naming ``label``, never the value.
    ``repr`` shows the label, so a list printed whole shows no value either."""

    __slots__ = ("_label", "_value")

    def __init__(self, label: str, value: str) -> None:
        self._label = label
        self._value = value

    def __str__(self) -> str:
        return self._value

    def __html__(self) -> str:
        return self._value  # inserted as it is in an HTML template too, never escaped

    def __repr__(self) -> str:
        return f"[{self._label}]"

    def __bool__(self) -> bool:
        return True

    def __hash__(self) -> int:
        return id(self)

    def refuse(self, what: str) -> NoReturn:
        raise OpaqueMisuse(f"{self._label} may only be inserted as it is: {what} is refused")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self.refuse(f"its attribute {name!r}")

    def _operator(self, *_: Any) -> Any:
        self.refuse("an operator")

    __getitem__ = __contains__ = __add__ = __radd__ = __mul__ = __rmul__ = _operator
    __mod__ = __rmod__ = __sub__ = __truediv__ = __floordiv__ = __pow__ = _operator
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _operator
    __format__ = __iter__ = __len__ = __neg__ = __pos__ = __call__ = _operator


MAX_OPAQUE_WALK = 100_000  # items a check for opaque values walks; past it, refused


def _opaque_in(*values: Any) -> Opaque | None:
    """The first opaque value in ``values``, in a list, tuple or mapping among them."""
    stack = list(values)
    walked = 0
    while stack:
        item = stack.pop()
        walked += 1
        if isinstance(item, Opaque):
            return item
        if walked > MAX_OPAQUE_WALK:
            raise OpaqueMisuse("a value too large to check for secrets")
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
    return None


def _refuse_opaque(what: str, *values: Any) -> None:
    found = _opaque_in(*values)
    if found is not None:
        found.refuse(what)


class _Budget:
    __slots__ = ("steps",)

    def __init__(self) -> None:
        self.steps = 0

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > MAX_STEPS:
            raise TemplateLimit(
                f"the template passed the evaluation limit of {MAX_STEPS} steps "
                "(loop iterations and calls)"
            )


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "lantern_template_budget", default=None
)


def _budget() -> _Budget:
    found = _BUDGET.get()
    # Outside ``budgeted`` (every render of lantern's goes through it) a call gets a budget
    # of its own rather than one that would grow across renders for ever.
    return found if found is not None else _Budget()


def budgeted(fn: Callable[[], Any]) -> Any:
    """Run one render under a fresh budget."""
    token = _BUDGET.set(_Budget())
    try:
        return fn()
    finally:
        _BUDGET.reset(token)


def _too_big(what: str, items: bool = False) -> TemplateLimit:
    if items:
        return TemplateLimit(f"{what} would pass the template limit of {MAX_ITEMS} list items")
    return TemplateLimit(f"{what} would pass the template output limit of {MAX_OUTPUT} characters")


def _size(value: Any) -> int | None:
    return len(value) if isinstance(value, str | bytes | list | tuple) else None


def _limit(value: Any) -> int:
    return MAX_OUTPUT if isinstance(value, str | bytes) else MAX_ITEMS


def _check_size(value: Any, what: str) -> Any:
    size = _size(value)
    if size is not None and size > _limit(value):
        raise _too_big(what, items=_limit(value) == MAX_ITEMS)
    return value


def _counted(iterable: Iterable[Any]) -> Iterator[Any]:
    budget = _budget()
    for item in iterable:
        budget.step()
        yield item


def _binop(operator: str, left: Any, right: Any) -> None:
    """Refuse, before computing it, a result past the limits."""
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            n = _size(seq)
            if n is not None and isinstance(times, int) and n * max(times, 0) > _limit(seq):
                raise _too_big("a repetition", items=_limit(seq) == MAX_ITEMS)
    elif operator == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            if abs(left).bit_length() * right > MAX_POWER_BITS:
                raise TemplateLimit(
                    f"a power would pass the template limit of {MAX_POWER_BITS}-bit integers"
                )
    elif operator == "+":
        a, b = _size(left), _size(right)
        if a is not None and b is not None and a + b > _limit(left):
            raise _too_big("a concatenation", items=_limit(left) == MAX_ITEMS)
    elif operator == "%" and isinstance(left, str):
        _check_format(left)


_WIDE = re.compile(r"\d{7,}")  # a width or precision of a million or more


def _check_format(spec: str) -> None:
    if _WIDE.search(spec):
        raise _too_big("a format width")


# Filters and str methods whose integer arguments are sizes of what they make.
_SIZED_FILTERS = frozenset({"center", "indent", "truncate", "wordwrap", "batch", "slice"})
_SIZED_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs"})


def _guard_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    skip = 1 if hasattr(fn, "jinja_pass_arg") else 0  # the context Jinja passes first

    @functools.wraps(fn)
    def guarded(*given: Any, **kwargs: Any) -> Any:
        _budget().step()
        args = given[skip:]
        _refuse_opaque(f"the {name} filter", *args, *kwargs.values())
        if name in _SIZED_FILTERS:
            for value in (*args, *kwargs.values()):
                if isinstance(value, int) and not isinstance(value, bool) and value > MAX_OUTPUT:
                    raise _too_big(f"the {name} filter")
        if name == "format" and args and isinstance(args[0], str):
            _check_format(args[0])
        if name == "replace" and len(args) >= 3:
            _check_replace(args[0], args[1], args[2])
        return _check_size(fn(*given, **kwargs), f"the {name} filter")

    return guarded


def _guard_test(name: str, fn: Any) -> Callable[..., Any]:
    skip = 1 if hasattr(fn, "jinja_pass_arg") else 0

    @functools.wraps(fn)
    def guarded(*given: Any, **kwargs: Any) -> Any:
        _refuse_opaque(f"the {name} test", *given[skip:], *kwargs.values())
        return fn(*given, **kwargs)

    return guarded


def _check_replace(text: Any, old: Any, new: Any) -> None:
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        count = len(text) + 1 if old == "" else text.count(old)
        if len(text) + count * max(len(new) - len(old), 0) > MAX_OUTPUT:
            raise _too_big("a replace")


# Constructs that turn rendered text into a value a template can go on transforming (a
# macro's or a block's output, a filter block, ``{% set x %}...{% endset %}``).
_CAPTURING = (nodes.Macro, nodes.CallBlock, nodes.FilterBlock, nodes.AssignBlock, nodes.Block)


def _no_capture_of_secrets(node: nodes.Template) -> None:
    """A template that names ``secrets`` may not capture what it renders: a secret's value
    inserted into captured text could be transformed after all."""
    if not any(n.name == "secrets" for n in node.find_all(nodes.Name)):
        return
    named = sorted(
        {
            g.attr
            for g in node.find_all(nodes.Getattr)
            if isinstance(g.node, nodes.Name) and g.node.name == "secrets"
        }
    )
    which = f"the secret {', '.join(named)}" if named else "secrets"
    for capture in _CAPTURING:
        found = next(iter(node.find_all(capture)), None)
        if found is not None:
            raise jinja2.TemplateSyntaxError(
                f"a template that uses {which} may not capture its output (macros, call, "
                "filter, set or named blocks): a secret is inserted as it is, never transformed",
                found.lineno,
            )


class _Generator(CodeGenerator):
    """Jinja's code generator with two changes: a loop's iterable is counted against the
    budget, and ``~`` goes through a checked join."""

    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        _no_capture_of_secrets(node)
        # Before the generator collects the filters a template uses, so this one is among them.
        for loop in node.find_all(nodes.For):
            loop.iter = nodes.Filter(
                loop.iter, "lantern_counted", [], [], None, None, lineno=loop.iter.lineno
            )
        super().visit_Template(node, frame)

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.lantern_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class LimitedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, its operators, calls, loops and filters on a budget."""

    code_generator_class = _Generator
    intercepted_binops = frozenset({"*", "**", "+", "%", "-", "/", "//"})
    intercepted_unops = frozenset({"-", "+"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        # lipsum makes text of any size; cycler, joiner and namespace are state a render
        # can grow without bound. None is needed for expressions over input and outputs.
        for name in ("lipsum", "cycler", "joiner", "namespace", "dict"):
            self.globals.pop(name, None)
        self.globals["range"] = self._range
        self.filters = {name: _guard_filter(name, fn) for name, fn in self.filters.items()}
        self.filters["lantern_counted"] = _counted
        guarded: dict[str, Any] = {n: _guard_test(n, fn) for n, fn in self.tests.items()}
        self.tests = guarded

    @staticmethod
    def _range(*args: int) -> range:
        _budget().step()
        return safe_range(*args)  # OverflowError past the sandbox's MAX_RANGE (100,000)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        _refuse_opaque(f"the {operator} operator", left, right)
        _binop(operator, left, right)
        return super().call_binop(context, operator, left, right)

    def call_unop(self, context: Context, operator: str, arg: Any) -> Any:
        _refuse_opaque(f"the unary {operator} operator", arg)
        return super().call_unop(context, operator, arg)

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, Opaque):
            obj.refuse(f"its attribute {attribute!r}")
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        if isinstance(obj, Opaque):
            obj.refuse("a slice or an index" if isinstance(argument, slice | int) else "an item")
        return super().getitem(obj, argument)

    def call(
        __self,
        __context: Context,
        __obj: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        _budget().step()
        _refuse_opaque("a call", __obj, *args, *kwargs.values())
        name = getattr(__obj, "__name__", "")
        # The sandbox hands out str.format wrapped; the string is the wrapped method's.
        owner = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
        if isinstance(owner, str):
            if name in _SIZED_METHODS:
                for value in (*args, *kwargs.values()):
                    if isinstance(value, int) and value > MAX_OUTPUT:
                        raise _too_big(f"str.{name}")
            elif name in ("format", "format_map"):
                _check_format(owner)
            elif name == "replace" and len(args) >= 2:
                _check_replace(owner, args[0], args[1])
            elif name == "join" and isinstance(args[0] if args else None, list | tuple):
                parts = args[0]
                total = sum(len(p) for p in parts if isinstance(p, str))
                if total + len(owner) * len(parts) > MAX_OUTPUT:
                    raise _too_big("a join")
        result = super().call(__context, __obj, *args, **kwargs)
        return _check_size(result, "a call")

    def lantern_concat(self, parts: tuple[Any, ...]) -> str:
        _refuse_opaque("the ~ operator", *[p for p in parts if isinstance(p, Opaque)])
        pieces = [str(p) for p in parts]
        if sum(len(p) for p in pieces) > MAX_OUTPUT:
            raise _too_big("a ~ concatenation")
        return "".join(pieces)


def render_bounded(template: jinja2.Template, context: dict[str, Any]) -> str:
    """Render ``template`` as a stream, stopping once it passes MAX_OUTPUT characters."""

    def run() -> str:
        chunks: list[str] = []
        total = 0
        for chunk in template.generate(**context):
            total += len(chunk)
            if total > MAX_OUTPUT:
                raise _too_big("the rendered template")
            chunks.append(chunk)
        return "".join(chunks)

    return str(budgeted(run))
