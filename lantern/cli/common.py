"""What every command shares: settings, the server or an opened store, and one-line errors.

A command that reads or changes runs goes to the server ``LANTERN_URL`` names when it is set
and to the database otherwise: ``server_or_database(through_server, on_database)`` picks, runs
the server's side with the blocking ``Api`` (no event loop, no HTTP library beyond the standard
library's) and the database's under asyncio, and turns any Lantern error into one line.

Behind a proxy both clients go through the one the environment names, as curl and httpx do:
``HTTPS_PROXY`` for an https:// server, ``HTTP_PROXY`` for an http:// one, ``ALL_PROXY`` for
either, in upper or lower case; ``NO_PROXY`` names the hosts reached directly.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

import click

from lantern.config import Settings
from lantern.errors import DefinitionError, LanternError, UsageError
from lantern.proxies import proxy_for

if TYPE_CHECKING:  # each command imports what it uses when it runs: `lantern --help` stays quick
    from rich.console import Console

    from lantern.cli.api import Api
    from lantern.sdk import AsyncClient
    from lantern.store.base import Store

T = TypeVar("T")

# The engine's lantern.engine.runs.DEFAULT_WORKSPACE (a test checks they agree), here so that a
# command's option defaults need no engine import.
DEFAULT_WORKSPACE = "default"


def settings(ctx: click.Context) -> Settings:
    obj = ctx.ensure_object(dict)
    if "settings" not in obj:
        try:
            obj["settings"] = Settings.from_env()
        except UsageError as exc:
            fail(str(exc), 2)
    found: Settings = obj["settings"]
    return found


def console() -> Console:
    """Rich output; when piped, wide enough that ids and statuses are never cut."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 160)


def colored() -> bool:
    """Whether to colour what goes to stdout: a terminal, unless NO_COLOR is set."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def with_database(ctx: click.Context, url: str | None) -> None:
    if url:
        ctx.obj["settings"] = replace(settings(ctx), database_url=url)
        ctx.obj["database_flag"] = True


def server() -> Api | None:
    """The server LANTERN_URL names, through the command line's blocking client; None without
    it (use the local database).

    One rule for every command that reads or changes runs: with a URL the command goes to that
    server or fails, never quietly to a local database the user did not mean."""
    found = _address()
    if found is None:
        return None
    from lantern.cli.api import Api

    return Api(*found, proxy=proxy_for(found[0]))


def remote() -> AsyncClient | None:
    """The SDK's client of the server LANTERN_URL names (``server()``'s rule), for the
    commands that still go through the SDK (following a run, journal, receipts, runtime,
    schedules, secrets, workers); None without it."""
    found = _address()
    if found is None:
        return None
    from lantern.sdk.client import AsyncClient

    return AsyncClient(*found)  # it checks the environment's proxy as server() does


def _address() -> tuple[str, str] | None:
    """LANTERN_URL and LANTERN_API_KEY; None without the URL, one usage line without the key."""
    url = os.environ.get("LANTERN_URL")
    if not url:
        return None
    ctx = click.get_current_context(silent=True)
    if ctx is not None and (ctx.obj or {}).get("database_flag"):
        raise UsageError(
            "--database-url and LANTERN_URL both given: unset LANTERN_URL to read a database"
        )
    key = os.environ.get("LANTERN_API_KEY")
    if not key:
        raise UsageError(
            f"LANTERN_URL is set ({url}) but LANTERN_API_KEY is not: set the key"
            " (`lantern keys create` prints one) or unset LANTERN_URL to use the local database"
        )
    return url, key


def cli_worker_id(s: Settings) -> str:
    """In-process runs get their own identity unless LANTERN_WORKER_ID names one."""
    return os.environ.get("LANTERN_WORKER_ID") or f"{socket.gethostname()}:cli-{os.getpid()}"


@asynccontextmanager
async def opened(s: Settings) -> AsyncIterator[Store]:
    from lantern.store.base import open_store

    store = open_store(s.database_url)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def server_or_database(
    through_server: Callable[[Api], T], on_database: Callable[[], Awaitable[T]]
) -> T:
    """The command's work through the server LANTERN_URL names (``through_server``, blocking)
    or else on the database (``on_database``, under asyncio, which only this side imports);
    a Lantern error becomes one line, as ``run`` makes it."""

    def body() -> T:
        api = server()
        if api is None:
            import asyncio

            return asyncio.run(on_database())  # type: ignore[arg-type]
        with api:
            return through_server(api)

    return guarded(body)


def run(fn: Callable[[], Awaitable[T]]) -> T:
    """Run an async command body; a Lantern error becomes one line, as ``guarded`` says."""
    import asyncio

    return guarded(lambda: asyncio.run(fn()))  # type: ignore[arg-type]


def guarded(fn: Callable[[], T]) -> T:
    """Call a command body; a Lantern error becomes one line on stderr and exit 1 (2 for
    usage)."""
    try:
        return fn()
    except DefinitionError as exc:
        fail(str(exc), 1)
    except UsageError as exc:
        if _from_api(exc):  # a 4xx the server answered is not a misuse of the command
            fail(str(exc), 1)
        fail(str(exc), 2)
    except LanternError as exc:
        fail(str(exc), 1)
    except Exception as exc:  # a driver or OS error: still one line, never a traceback
        fail(f"{type(exc).__name__}: {exc}", 1)
    raise AssertionError("unreachable")


def _from_api(exc: BaseException) -> bool:
    # The SDK's errors are imported only by commands that talk to a server: where they are not
    # loaded, no error can have come from one.
    errors = sys.modules.get("lantern.sdk.errors")
    return errors is not None and isinstance(exc, errors.ApiError)


def fail(message: str, status: int) -> None:
    click.echo(f"error: {' '.join(message.split())}", err=True)
    sys.exit(status)


def parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc}") from exc
