"""@app.agent: registration, versions, and the one-line errors of its misuse."""

from __future__ import annotations

from typing import Any

import pytest

import lantern
from lantern.app import source_digest
from lantern.errors import UsageError


def test_an_async_and_a_plain_function_register_with_a_source_digest() -> None:
    app = lantern.App()

    @app.agent("research")
    async def research(ctx: lantern.Context, topic: str) -> dict[str, Any]:
        return {"topic": topic}

    @app.agent("tally")
    def tally(ctx: lantern.Context, n: int) -> int:
        return n

    a, t = app.agents["research"], app.agents["tally"]
    assert (a.blocking, t.blocking) == (False, True)
    assert a.version == source_digest(research) and len(a.version) == 12
    assert a.module == __name__
    assert a.definition() == {
        "name": "research",
        "code": {"version": a.version, "module": __name__, "function": research.__qualname__},
    }
    assert research.__name__ == "research"  # the decorator hands the function back


def test_the_digest_follows_the_source_and_a_given_version_wins() -> None:
    def one(ctx: lantern.Context) -> int:
        return 1

    def two(ctx: lantern.Context) -> int:
        return 2

    assert source_digest(one) != source_digest(two)
    app = lantern.App()
    app.agent("pinned", version="2026-12-01")(one)
    assert app.agents["pinned"].version == "2026-12-01"


def test_a_bare_decorator_takes_the_function_name() -> None:
    app = lantern.App()

    @app.agent
    async def summarise(ctx: lantern.Context, text: str) -> str:
        return text

    assert app.agents["summarise"].fn is summarise


def _fn(ctx: lantern.Context) -> None:
    return None


@pytest.mark.parametrize(
    ("name", "fn", "version", "says"),
    [
        (3, _fn, None, "the name must be a string"),
        ("has space", _fn, None, "the name must be a string"),
        ("ok", _fn, "", "version must be a non-empty string"),
        ("ok", _fn, "a b", "version must be a non-empty string"),
        ("ok", lambda: None, None, "must take the context first"),
        ("ok", object, None, "decorates a function"),
    ],
)
def test_misuse_is_one_clear_line(name: Any, fn: Any, version: Any, says: str) -> None:
    app = lantern.App()
    with pytest.raises(UsageError, match=says):
        app.agent(name, version=version)(fn)
    assert app.agents == {}


def test_a_generator_and_a_second_registration_are_refused() -> None:
    app = lantern.App()

    async def gen(ctx: lantern.Context) -> Any:
        yield 1

    with pytest.raises(UsageError, match="is a generator"):
        app.agent("gen")(gen)
    app.agent("once")(_fn)
    with pytest.raises(UsageError, match="registered twice"):
        app.agent("once")(_fn)


def test_context_is_abstract() -> None:
    with pytest.raises(TypeError):
        lantern.Context()  # type: ignore[abstract]
