"""The public API: ``lantern.__all__`` changes only on purpose, and every name in it resolves."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import lantern

PUBLIC = [
    "Agent",
    "ApiError",
    "App",
    "Approval",
    "AsyncClient",
    "AuthenticationError",
    "BadRequest",
    "Client",
    "Conflict",
    "ConflictError",
    "ConnectionFailed",
    "Context",
    "DefinitionError",
    "Event",
    "Forbidden",
    "InvalidResponse",
    "LanternError",
    "LeaseLost",
    "LiveTexts",
    "ModelReply",
    "NotFound",
    "NotFoundError",
    "Page",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "Receipt",
    "Run",
    "ServerError",
    "StepError",
    "StoreError",
    "TextDelta",
    "TextReset",
    "ToolContext",
    "Unauthorized",
    "Unprocessable",
    "Usage",
    "UsageError",
    "WaitTimeout",
    "__version__",
]


def test_all_is_pinned() -> None:
    # Changing the public API? Update PUBLIC here in the same change, on purpose.
    assert list(lantern.__all__) == PUBLIC


def test_all_has_no_duplicates_and_is_sorted() -> None:
    assert len(set(lantern.__all__)) == len(lantern.__all__)
    assert list(lantern.__all__) == sorted(lantern.__all__)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(lantern, name, None) is not None


def test_star_import_gives_exactly_the_public_names() -> None:
    namespace: dict[str, object] = {}
    exec("from lantern import *", namespace)
    namespace.pop("__builtins__", None)
    assert sorted(namespace) == sorted(PUBLIC)


def test_the_errors_are_one_tree() -> None:
    assert issubclass(lantern.UsageError, lantern.LanternError)
    assert issubclass(lantern.DefinitionError, lantern.UsageError)
    assert issubclass(lantern.NotFound, lantern.LanternError)
    assert issubclass(lantern.StoreError, lantern.LanternError)
    assert issubclass(lantern.LeaseLost, lantern.StoreError)
    assert issubclass(lantern.StepError, lantern.LanternError)
    assert issubclass(lantern.LanternError, Exception)


def test_the_public_names_are_the_real_objects() -> None:
    from lantern.app import App, ToolContext
    from lantern.errors import DefinitionError

    assert lantern.App is App
    assert lantern.ToolContext is ToolContext
    assert lantern.DefinitionError is DefinitionError


def test_the_version_matches_the_package_metadata() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", lantern.__version__)
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text())["project"]
    assert lantern.__version__ == project["version"]


def test_a_user_module_can_use_the_public_api() -> None:
    app = lantern.App()

    @app.tool("crm.lookup")
    def lookup(ctx: lantern.ToolContext, id: str) -> dict[str, str]:
        """Find a customer."""
        return {"id": id}

    assert app.tools["crm.lookup"].context_param == "ctx"
    assert app.tools["crm.lookup"].description == "Find a customer."
