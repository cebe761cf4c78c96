"""The ``lantern`` command starts quickly: each command imports what it uses when it runs.

``lantern --help`` loads click and the command modules, not the engine, the store or its
drivers, the web server, the API client or a model provider's SDK; a command that talks to a
server loads the command line's blocking client (``lantern.cli.api``, the standard library's
``http.client``) but no event loop, no SDK client or its HTTP library, and still none of the
engine, the store's drivers or the web server. bench/cli.py times them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lantern.cli.common import DEFAULT_WORKSPACE
from lantern.engine.runs import DEFAULT_WORKSPACE as ENGINE_WORKSPACE

# Runs the CLI in a fresh interpreter and prints the modules it imported, whatever it exits with.
PROBE = """
import json, sys
sys.argv = ["lantern", *json.loads(sys.argv[1])]
from lantern.cli.main import main
try:
    main()
except SystemExit:
    pass
sys.stdout.flush()
print("MODULES" + json.dumps(sorted(k for k, v in sys.modules.items() if v is not None)))
"""

HEAVY = (
    "lantern.engine",
    "lantern.store.sqlite",
    "lantern.store.postgres",
    "lantern.server",
    "lantern.nodes",
    "lantern.models",
    "lantern.runtime",
    "lantern.integrations",
    "aiosqlite",
    "psycopg",
    "fastapi",
    "starlette",
    "uvicorn",
    "openai",
    "anthropic",
    "pydantic_ai",
    "agents",
    "mcp",
    "opentelemetry",
)

# The journal's event kinds, which `runs show` names: plain constants, no executor behind them.
VOCABULARY = {"lantern.engine", "lantern.engine.events", "lantern.nodes", "lantern.nodes.notes"}


def probed(args: list[str], env: dict[str, str] | None = None) -> tuple[set[str], str]:
    """The modules the command imported, and what it wrote to stderr."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("MODULES"))
    return set(json.loads(line.removeprefix("MODULES"))), done.stderr


def imported(args: list[str], env: dict[str, str] | None = None) -> set[str]:
    return probed(args, env)[0]


def under(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


def test_help_imports_no_engine_store_server_client_or_provider_sdk() -> None:
    modules = imported(["--help"])
    assert "lantern.cli.main" in modules and "click" in modules
    lighter = (*HEAVY, "lantern.store", "lantern.sdk", "lantern.app", "httpx", "rich", "yaml")
    assert under(modules, lighter) == []
    assert "asyncio" not in modules  # no command body has run


class Refusing(BaseHTTPRequestHandler):
    """A server that refuses every key: each command gets as far as its first request."""

    def do_GET(self) -> None:
        body = b'{"title": "Unauthorized", "status": 401, "detail": "unknown key"}'
        self.send_response(401)
        self.send_header("Content-Type", "application/problem+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def refusing_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# What a command through a server does without: the SDK's async client, its HTTP library and
# any event loop.
ASYNC_CLIENT = (
    "lantern.sdk.client",
    "lantern.sdk.sync",
    "lantern.sdk.stream",
    "httpx",
    "httpcore",
    "anyio",
    "asyncio",
)


@pytest.mark.parametrize(
    "args",
    [
        ["runs", "list"],
        ["runs", "show", "run_" + "0" * 28],
        ["runs", "approve", "run_" + "0" * 28],
        ["limits", "list"],
    ],
    ids=" ".join,
)
def test_a_command_through_a_server_imports_no_event_loop_async_client_engine_or_driver(
    refusing_url: str, args: list[str]
) -> None:
    env = {**os.environ, "LANTERN_URL": refusing_url, "LANTERN_API_KEY": "lk_x_y"}
    modules, stderr = probed(args, env)
    assert "401 Unauthorized: unknown key" in stderr  # it did ask the server
    assert "lantern.cli.api" in modules and "http.client" in modules
    assert under(modules - VOCABULARY, (*HEAVY, *ASYNC_CLIENT)) == []
    # Nor the store's records (dozens of dataclasses): the client reads statuses only.
    assert "lantern.store.records" not in modules
    assert under(modules, ("rich",)) == []  # plain lines, a few ANSI codes on a terminal


def test_the_cli_default_workspace_is_the_engines() -> None:
    assert DEFAULT_WORKSPACE == ENGINE_WORKSPACE
