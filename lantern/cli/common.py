"""What every command shares: settings, an opened store, and one-line errors."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, TypeVar

import click
from rich.console import Console

from lantern.config import Settings
from lantern.errors import DefinitionError, LanternError, UsageError
from lantern.sdk import AsyncClient
from lantern.sdk.errors import ApiError
from lantern.store.base import Store, open_store

T = TypeVar("T")


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
    return Console(width=None if sys.stdout.isatty() else 160)


def with_database(ctx: click.Context, url: str | None) -> None:
    if url:
        ctx.obj["settings"] = replace(settings(ctx), database_url=url)
        ctx.obj["database_flag"] = True


def remote() -> AsyncClient | None:
    """The client of the server LANTERN_URL names; None without it (use the local database).

    One rule for every command that reads or changes runs: with a URL the command goes to that
    server or fails, never quietly to a local database the user did not mean."""
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
    return AsyncClient(url, key)


def cli_worker_id(s: Settings) -> str:
    """In-process runs get their own identity unless LANTERN_WORKER_ID names one."""
    return os.environ.get("LANTERN_WORKER_ID") or f"{socket.gethostname()}:cli-{os.getpid()}"


@asynccontextmanager
async def opened(s: Settings) -> AsyncIterator[Store]:
    store = open_store(s.database_url)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def run(fn: Callable[[], Awaitable[T]]) -> T:
    """Run a command body; a Lantern error becomes one line on stderr and exit 1 (2 for usage)."""
    try:
        return asyncio.run(fn())  # type: ignore[arg-type]
    except (DefinitionError, ApiError) as exc:
        fail(str(exc), 1)
    except UsageError as exc:
        fail(str(exc), 2)
    except LanternError as exc:
        fail(str(exc), 1)
    except Exception as exc:  # a driver or OS error: still one line, never a traceback
        fail(f"{type(exc).__name__}: {exc}", 1)
    raise AssertionError("unreachable")


def fail(message: str, status: int) -> None:
    click.echo(f"error: {' '.join(message.split())}", err=True)
    sys.exit(status)


def parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc}") from exc
