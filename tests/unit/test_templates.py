"""Templates: native values for a lone expression, strings otherwise, and a real sandbox."""

from __future__ import annotations

from typing import Any

import pytest

from lantern.errors import StepError, TemplateError
from lantern.nodes.templates import check, render

CONTEXT: dict[str, Any] = {
    "input": {
        "count": 3,
        "ratio": 0.5,
        "ok": True,
        "nothing": None,
        "name": "Ada",
        "zero": 0,
        "customer": {"id": "c1", "tags": ["vip", "eu"]},
    },
    "steps": {"lookup": {"output": {"name": "Ada Lovelace", "score": 7}}},
}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ input.count }}", 3),
        ("{{ input.ratio }}", 0.5),
        ("{{ input.ok }}", True),
        ("{{ input.nothing }}", None),
        ("{{ input.customer }}", {"id": "c1", "tags": ["vip", "eu"]}),
        ("{{ input.customer.tags }}", ["vip", "eu"]),
        ("{{ steps.lookup.output.score }}", 7),
        ("{{ input.count + 1 }}", 4),
        ("  {{ input.count }}\n", 3),  # surrounding whitespace does not make it text
        ("{{- input.count -}}", 3),  # nor do whitespace-control markers
        ("{{ input.count -}}", 3),
        ("{{ input.count - 1 }}", 2),
        ("{{ input }}", CONTEXT["input"]),
    ],
)
def test_a_lone_expression_keeps_its_native_type(template: str, expected: Any) -> None:
    result = render(template, CONTEXT)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("n={{ input.count }}", "n=3"),
        ("{{ input.count }}{{ input.count }}", "33"),
        ("{{ input.count }} and {{ input.name }}", "3 and Ada"),
        ("Welcome {{ steps.lookup.output.name }}!", "Welcome Ada Lovelace!"),
        ("{% if input.ok %}yes{% else %}no{% endif %}", "yes"),
        ("{{ input.name | upper }} {{ input.customer.tags | join(',') }}", "ADA vip,eu"),
        ("no templates here", "no templates here"),
        ("{{ '}}' }}", "}}"),
    ],
)
def test_mixed_text_renders_to_a_string(template: str, expected: str) -> None:
    assert render(template, CONTEXT) == expected


def test_nested_dicts_and_lists_render_every_string() -> None:
    value = {
        "id": "{{ input.customer.id }}",
        "count": "{{ input.count }}",
        "greeting": "Hi {{ input.name }}",
        "plain": 42,
        "nested": {"tags": "{{ input.customer.tags }}", "list": ["{{ input.ok }}", "x", None]},
    }
    assert render(value, CONTEXT) == {
        "id": "c1",
        "count": 3,
        "greeting": "Hi Ada",
        "plain": 42,
        "nested": {"tags": ["vip", "eu"], "list": [True, "x", None]},
    }


def test_a_rendered_value_is_a_copy_a_tool_may_change() -> None:
    # A tool that appends to its argument must not change what later steps (or the run's
    # input) read in this drive, or a re-drive, which reads the journal, would see otherwise.
    context = {"input": {"customer": {"tags": ["vip"]}}}
    value = {"a": ["{{ input.customer }}"]}
    rendered = render(value, context)
    rendered["a"][0]["tags"].append("changed")
    assert context == {"input": {"customer": {"tags": ["vip"]}}}
    assert value == {"a": ["{{ input.customer }}"]}


@pytest.mark.parametrize(
    ("template", "missing"),
    [
        ("{{ input.missing }}", "missing"),
        ("Hello {{ input.missing }}", "missing"),
        ("{{ input.customer.email }}", "email"),
        ("{{ steps.absent.output.x }}", "absent"),
        ("{{ nowhere }}", "nowhere"),
    ],
)
def test_a_missing_variable_is_a_template_error_naming_it(template: str, missing: str) -> None:
    with pytest.raises(TemplateError) as info:
        render({"args": {"id": template}}, CONTEXT, where="lookup")
    message = str(info.value)
    assert f"'{missing}'" in message
    assert "lookup.args.id" in message  # where: the node and the field
    assert message.startswith("template error in lookup.args.id: ")


def test_the_place_of_an_error_inside_a_list_is_named() -> None:
    with pytest.raises(TemplateError, match=r"in body\.items\[1\]: .*'nope'"):
        render({"items": ["{{ input.count }}", "{{ input.nope }}"]}, CONTEXT, where="body")


def test_a_template_error_is_a_non_retryable_step_error() -> None:
    with pytest.raises(StepError) as info:
        render("{{ input.missing }}", CONTEXT)
    assert isinstance(info.value, TemplateError)
    assert info.value.retryable is False
    assert info.value.to_json()["class"] == "tool"


@pytest.mark.parametrize(
    "template",
    [
        "{{ input.__class__.__mro__ }}",
        "{{ input.__class__ }}",
        "{{ ''.__class__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "x {{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ input.customer.__init__.__globals__ }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ input.name.format.__globals__ }}",
    ],
)
def test_the_sandbox_refuses_unsafe_internals(template: str) -> None:
    with pytest.raises(TemplateError) as info:
        render(template, CONTEXT, where="n.args.x")
    assert "n.args.x" in str(info.value)


@pytest.mark.parametrize(
    "template",
    [
        "{{ input.customer.tags.append('hacked') }}",
        "{{ input.customer.update({'id': 'hacked'}) }}",
        "{{ input.customer.tags.pop() }}",
    ],
)
def test_the_sandbox_refuses_to_mutate_the_context(template: str) -> None:
    context = {"input": {"customer": {"id": "c1", "tags": ["vip"]}}}
    with pytest.raises(TemplateError, match="unsafe"):
        render(template, context)
    assert context == {"input": {"customer": {"id": "c1", "tags": ["vip"]}}}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ input.count / input.zero }}", "ZeroDivisionError"),
        ("total: {{ input.count / input.zero }}", "ZeroDivisionError"),
        ("{{ input.count + input.name }}", "TypeError"),
        ("{{ range(10 ** 9) | list }}", "OverflowError"),
    ],
)
def test_an_expression_that_raises_is_a_template_error(template: str, expected: str) -> None:
    # Not a bare Python exception, which would escape the step and crash the drive.
    with pytest.raises(TemplateError, match=f"in s.x: {expected}"):
        render(template, CONTEXT, where="s.x")


@pytest.mark.parametrize(
    "template",
    ["{{ input.x }}", "a {{ b }} c", "{% if x %}y{% endif %}", "{{- x -}}", "plain"],
)
def test_check_accepts_valid_templates(template: str) -> None:
    assert check(template) is None


@pytest.mark.parametrize(
    "template", ["{{ input.x ", "{{ }}", "{% if %}", "{{ a b }}", "{% endif %}"]
)
def test_check_reports_syntax_errors(template: str) -> None:
    error = check(template)
    assert isinstance(error, str) and error


@pytest.mark.parametrize(
    "template", ["{{- input.count -}}", "{{ input.count -}}", "{{+ input.name }}"]
)
def test_what_check_accepts_renders(template: str) -> None:
    assert check(template) is None
    render(template, CONTEXT)
