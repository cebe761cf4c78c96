"""`lantern keys`: create (shown once), list and revoke API keys."""

from __future__ import annotations

import click

from lantern.cli.common import DEFAULT_WORKSPACE, console, opened, run, settings, with_database
from lantern.errors import NotFound


@click.group()
def keys() -> None:
    """API keys: each belongs to a workspace and carries scopes."""


@keys.command("create")
@click.option("--scopes", default="", help="Comma-separated: runs:execute,runs:read,...")
@click.option("--workspace", default=DEFAULT_WORKSPACE, show_default=True)
@click.option("--name", help="Who holds the key (shown where it approves or cancels).")
@click.option(
    "--operator",
    is_flag=True,
    help="Also reads the cluster's state across workspaces (/v1/runtime/scheduler, "
    "/v1/runtime/nodes), which a workspace's admin key cannot.",
)
@click.option("--database-url", help="Overrides LANTERN_DATABASE_URL.")
@click.pass_context
def create(
    ctx: click.Context,
    scopes: str,
    workspace: str,
    name: str | None,
    operator: bool,
    database_url: str | None,
) -> None:
    """Print a new key. It is shown this once: only its hash is stored."""
    with_database(ctx, database_url)
    s = settings(ctx)

    async def body() -> None:
        from lantern.server.auth import issue_key

        async with opened(s) as store:
            wanted = {p.strip() for p in scopes.split(",") if p.strip()}
            _, plaintext = await issue_key(store, workspace, wanted, name, operator=operator)
        click.echo(plaintext)

    run(body)


@keys.command("list")
@click.option("--workspace", help="Only this workspace's keys.")
@click.option("--database-url", help="Overrides LANTERN_DATABASE_URL.")
@click.pass_context
def list_keys(ctx: click.Context, workspace: str | None, database_url: str | None) -> None:
    """Keys by id (never their secrets)."""
    from rich.table import Table

    with_database(ctx, database_url)
    s = settings(ctx)

    async def body() -> None:
        async with opened(s) as store:
            found = await store.list_api_keys(workspace)
        table = Table("id", "name", "workspace", "scopes", "created", "revoked")
        for k in found:
            table.add_row(
                k.id,
                k.name or "",
                k.workspace,
                " ".join(sorted(k.scopes)),
                k.created_at.isoformat(" ", "seconds"),
                k.revoked_at.isoformat(" ", "seconds") if k.revoked_at else "",
            )
        console().print(table)

    run(body)


@keys.command("revoke")
@click.argument("key_id")
@click.option("--database-url", help="Overrides LANTERN_DATABASE_URL.")
@click.pass_context
def revoke(ctx: click.Context, key_id: str, database_url: str | None) -> None:
    """Revoke a key by its id (the part after lk_, before the second _)."""
    with_database(ctx, database_url)
    s = settings(ctx)

    async def body() -> None:
        async with opened(s) as store:
            if not await store.revoke_api_key(key_id.removeprefix("lk_").split("_")[0]):
                raise NotFound(f"no live key {key_id}")
        click.echo(f"revoked {key_id}")

    run(body)
