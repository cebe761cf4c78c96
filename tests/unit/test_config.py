"""Configuration enters once: lantern/config.py reads the environment and everything else
receives values. The scan below fails on a new read anywhere else in the package; the rest pins
how the settings that moved into config.py are read and parsed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lantern import config, threads
from lantern.config import ModelSettings, Settings
from lantern.errors import UsageError
from lantern.models import pricing
from lantern.models.budget import Budget
from lantern.models.registry import Models

PACKAGE = Path(__file__).resolve().parents[2] / "lantern"

# Where reading the environment is the module's job, and why.
ALLOWED = {
    "config.py": "the one reader of Lantern's settings",
    "workload/": "runs in a microVM without the rest of lantern; main() reads LANTERN_RESUME",
    "sdk/client.py": "the SDK's defaults: LANTERN_URL and LANTERN_API_KEY",
    "cli/common.py": "the CLI's edge: LANTERN_URL, LANTERN_API_KEY, LANTERN_WORKER_ID",
    "proxies.py": "the *_PROXY variables, as httpx reads them, checked for the CLI and the SDK",
    "cli/runtime.py": "the CLI's edge: LANTERN_URL of `lantern node`",
    "cli/serve.py": "the CLI's edge: whether LANTERN_WORKER_ID was set beside --port",
    "demo/": "demo scripts build their child processes' environments",
    "integrations/mcp.py": "an MCP server's child process inherits the environment",
}


def environment_reads(source: str) -> list[int]:
    """Lines that touch ``os.environ``/``os.environb``/``os.getenv`` or import them."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "environb", "getenv"):
            found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(a.name in ("environ", "environb", "getenv") for a in node.names):
                found.append(node.lineno)
    return found


def allowed(relative: str) -> bool:
    return any(relative == a or (a.endswith("/") and relative.startswith(a)) for a in ALLOWED)


def test_only_config_reads_the_environment() -> None:
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if allowed(relative):
            continue
        stray += [f"lantern/{relative}:{line}" for line in environment_reads(path.read_text())]
    assert stray == [], f"read the setting in lantern/config.py and pass it down: {stray}"


def test_the_scan_sees_every_form_of_read() -> None:
    for source in (
        "import os\nx = os.environ.get('A')\n",
        "import os\nx = os.environ['A']\n",
        "import os\nx = os.getenv('A')\n",
        "from os import environ\n",
        "from os import getenv as g\n",
    ):
        assert environment_reads(source), source
    assert environment_reads("import os\nx = os.getpid()\n") == []


def test_model_settings_come_from_their_variables() -> None:
    env = {
        "LANTERN_MODEL_ROUTES": '{"r": ["gpt-4o-mini"]}',
        "LANTERN_MODEL_ROUTES_FILE": "/etc/routes.yaml",
        "LANTERN_MODEL_PRICES": "/etc/prices.json",
        "LANTERN_UNKNOWN_MODEL_PRICE": " 1,2 ",
        "LANTERN_WORKSPACE_BUDGETS": '{"acme": {"maxUsd": 5}}',
    }
    assert Settings.from_env(env).models == ModelSettings(
        routes='{"r": ["gpt-4o-mini"]}',
        routes_file="/etc/routes.yaml",
        prices_file="/etc/prices.json",
        unknown_price="1,2",
        workspace_budgets='{"acme": {"maxUsd": 5}}',
    )
    # Set but empty is unset, as it always was.
    assert ModelSettings.from_env(dict.fromkeys(env, "")) == ModelSettings()


def test_a_registry_is_built_from_the_model_settings(tmp_path: Path) -> None:
    routes_file = tmp_path / "routes.yaml"
    routes_file.write_text("cheap: [gpt-4o-mini, claude-haiku-4-5]\nstrong: [gpt-4o]\n")
    prices_file = tmp_path / "prices.json"
    prices_file.write_text('{"models": {"house-model": {"input": 1, "output": 2}}}')
    models = Models.from_settings(
        ModelSettings(
            routes='{"strong": ["claude-sonnet-4-5"]}',  # inline wins a name both define
            routes_file=str(routes_file),
            prices_file=str(prices_file),
            unknown_price="3,4",
            workspace_budgets='{"acme": {"maxUsd": 5, "maxTokens": 100}}',
        )
    )
    assert dict(models.routes) == {
        "cheap": ("gpt-4o-mini", "claude-haiku-4-5"),
        "strong": ("claude-sonnet-4-5",),
    }
    assert models.prices.price("house-model") == pricing.Price(1, 2)
    assert models.prices.price("gpt-4o") == pricing.price("gpt-4o")  # the shipped table stays
    assert models.prices.price("mystery") == pricing.Price(3, 4)
    assert dict(models.workspace_budgets) == {"acme": Budget(max_usd=5, max_tokens=100)}
    # Nothing configured: no routes, the shipped prices, nothing assumed, no budgets.
    plain = Models.from_settings(ModelSettings())
    assert dict(plain.routes) == {} and dict(plain.workspace_budgets) == {}
    assert plain.prices.price("mystery") is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (ModelSettings(routes="{"), "LANTERN_MODEL_ROUTES is not JSON"),
        (ModelSettings(routes='{"r": []}'), "non-empty list"),
        (ModelSettings(routes_file="/nonexistent/routes.yaml"), "LANTERN_MODEL_ROUTES_FILE="),
        (ModelSettings(prices_file="/nonexistent/prices.json"), "LANTERN_MODEL_PRICES="),
        (ModelSettings(unknown_price="free"), "INPUT,OUTPUT"),
        (ModelSettings(unknown_price="-1,2"), "cannot be negative"),
        (ModelSettings(workspace_budgets="nope"), "LANTERN_WORKSPACE_BUDGETS is not JSON"),
        (ModelSettings(workspace_budgets='{"a": {"maxUsd": -1}}'), "maxUsd must be"),
    ],
)
def test_a_broken_model_setting_is_one_usage_error(settings: ModelSettings, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        Models.from_settings(settings)


def test_tool_threads_fall_back_to_32_unless_a_positive_integer() -> None:
    assert Settings.from_env({}).tool_threads == 32
    assert Settings.from_env({"LANTERN_TOOL_THREADS": "4"}).tool_threads == 4
    for bad in ("0", "-3", "many", ""):
        assert config.tool_threads({"LANTERN_TOOL_THREADS": bad}) == 32


async def test_the_tool_pool_takes_the_size_it_is_given() -> None:
    try:
        threads.configure(3)
        assert threads.pool()._max_workers == 3
        first = threads.pool()
        threads.configure(3)
        assert threads.pool() is first  # the same size keeps the pool
        threads.configure(5)
        assert threads.pool()._max_workers == 5
        assert await threads.run_sync(lambda: "ran") == "ran"
    finally:
        threads.configure(threads.DEFAULT_THREADS)
