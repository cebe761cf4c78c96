"""`lantern secrets set|list|delete`: a workspace's secrets (docs/security.md).

A value is read from stdin, never from an argument (which would sit in the shell's history
and in every process listing), and never printed back: `list` shows names and times. With
LANTERN_URL set each goes to that server (its sealing key, the API key's workspace), as every
command that has an API does.
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from lantern.cli.common import (
    DEFAULT_WORKSPACE,
    console,
    opened,
    remote,
    run,
    settings,
    with_database,
)
from lantern.config import Settings
from lantern.errors import NotFound, UsageError

if TYPE_CHECKING:
    from lantern.sdk import AsyncClient
    from lantern.secrets.vault import Vault
    from lantern.store.base import Store

Workspace = click.option("--workspace", default=DEFAULT_WORKSPACE, show_default=True)
Database = click.option("--database-url", help="Overrides LANTERN_DATABASE_URL.")


@click.group()
def secrets() -> None:
    """Secrets agents use as {{ secrets.NAME }}; values are sealed at rest and never shown."""


def _vault(s: Settings, store: Store) -> Vault:
    from lantern.secrets import box
    from lantern.secrets.vault import Vault

    return Vault(store, box.load(s.secrets_key, s.data_path))


def _workspace(name: str) -> str:
    if not name or len(name) > 100:
        raise UsageError("a workspace name is 1-100 characters")
    return name


def _remote() -> AsyncClient | None:
    """The server LANTERN_URL names, whose key decides the workspace: --workspace is for the
    database only."""
    api = remote()
    ctx = click.get_current_context()
    if api is not None and ctx.get_parameter_source("workspace") == ParameterSource.COMMANDLINE:
        raise UsageError(
            "--workspace is for the database: through LANTERN_URL the key's workspace is used"
        )
    return api


@secrets.command("set")
@click.argument("name")
@Workspace
@Database
@click.pass_context
def set_secret(ctx: click.Context, name: str, workspace: str, database_url: str | None) -> None:
    """Set NAME to the value read from stdin (one trailing newline is dropped)."""
    with_database(ctx, database_url)
    s = settings(ctx)

    async def body() -> None:
        _workspace(workspace)
        api = _remote()  # where it goes is settled before the value is asked for
        if sys.stdin.isatty():
            click.echo(f"value for {name} (end with Ctrl-D):", err=True)
        value = sys.stdin.read()
        value = value[:-1] if value.endswith("\n") else value
        if api is not None:
            async with api:
                await api.set_secret(name, value)
            click.echo(f"set {name} on {api.base_url}")
            return
        async with opened(s) as store:
            await _vault(s, store).set(workspace, name, value)
        click.echo(f"set {name} in workspace {workspace}")

    run(body)


@secrets.command("list")
@Workspace
@Database
@click.pass_context
def list_secrets(ctx: click.Context, workspace: str, database_url: str | None) -> None:
    """The workspace's secrets by name (never their values)."""
    with_database(ctx, database_url)
    s = settings(ctx)

    async def body() -> None:
        rows: list[tuple[str, str, str]]
        api = _remote()
        if api is not None:
            async with api:
                listed = await api.secrets()
            rows = [(i["name"], _when(i["createdAt"]), _when(i["updatedAt"])) for i in listed]
        else:
            async with opened(s) as store:
                found = await store.list_secrets(_workspace(workspace))
            rows = [
                (
                    i.name,
                    i.created_at.isoformat(" ", "seconds"),
                    i.updated_at.isoformat(" ", "seconds"),
                )
                for i in found
            ]
        from rich.table import Table

        table = Table("name", "created", "updated")
        for row in rows:
            table.add_row(*row)
        console().print(table)

    run(body)


@secrets.command("delete")
@click.argument("name")
@Workspace
@Database
@click.pass_context
def delete_secret(ctx: click.Context, name: str, workspace: str, database_url: str | None) -> None:
    """Delete NAME; a step that uses it afterwards fails naming it."""
    with_database(ctx, database_url)
    s = settings(ctx)

    async def body() -> None:
        api = _remote()
        if api is not None:
            async with api:
                await api.delete_secret(name)
            click.echo(f"deleted {name} on {api.base_url}")
            return
        async with opened(s) as store:
            if not await _vault(s, store).delete(_workspace(workspace), name):
                raise NotFound(f"no secret {name} in workspace {workspace}")
        click.echo(f"deleted {name} from workspace {workspace}")

    run(body)


def _when(iso: str) -> str:
    """An API timestamp as the database rows print: to the second, a space before the time."""
    return datetime.fromisoformat(iso).isoformat(" ", "seconds")
