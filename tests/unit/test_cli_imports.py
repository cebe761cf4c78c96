"""The ``lantern`` command starts quickly: each command imports what it uses when it runs.

``lantern --help`` loads click and the command modules, not the engine, the store or its
drivers, the web server, the API client or a model provider's SDK; a command that talks to a
server loads the API client but still none of the engine, the store's drivers or the web
server. bench/cli.py times them.
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


def imported(args: list[str], env: dict[str, str] | None = None) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("MODULES"))
    return set(json.loads(line.removeprefix("MODULES")))


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


def test_a_command_through_a_server_imports_the_client_but_no_engine_or_driver(
    refusing_url: str,
) -> None:
    env = {**os.environ, "LANTERN_URL": refusing_url, "LANTERN_API_KEY": "lk_x_y"}
    run_id = "run_" + "0" * 28
    for args in (
        ["runs", "list"],
        ["runs", "show", run_id],
        ["runs", "approve", run_id],
        ["limits", "list"],
    ):
        modules = imported(args, env)
        assert "lantern.sdk.client" in modules, args
        assert under(modules - VOCABULARY, HEAVY) == [], args
        # Nor the store's records (dozens of dataclasses): the client reads statuses only.
        assert "lantern.store.records" not in modules, args


def test_the_cli_default_workspace_is_the_engines() -> None:
    assert DEFAULT_WORKSPACE == ENGINE_WORKSPACE
