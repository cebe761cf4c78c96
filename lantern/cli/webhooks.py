"""`lantern webhooks secret`: the workspace's webhook signing secret, made on first use.

Unlike an API key, a signing secret is kept in the clear (signing needs it), so it can be
shown again whenever asked. See docs/webhooks.md for what receivers do with it.
"""

from __future__ import annotations

import click

from lantern.cli.common import DEFAULT_WORKSPACE, opened, run, settings, with_database
from lantern.durations import parse_duration
from lantern.errors import UsageError

DEFAULT_OVERLAP = "24h"


@click.group()
def webhooks() -> None:
    """Signed webhooks: the secret http connectors sign their requests with."""


@webhooks.command("secret")
@click.option("--workspace", default=DEFAULT_WORKSPACE, show_default=True)
@click.option("--rotate", is_flag=True, help="Replace the secret with a new one and print it.")
@click.option(
    "--overlap",
    metavar="DURATION",
    help=f"With --rotate: how long the old secret keeps signing too [default: {DEFAULT_OVERLAP}]"
    " (0 stops it at once, for a leaked secret).",
)
@click.option("--database-url", help="Overrides LANTERN_DATABASE_URL.")
@click.pass_context
def secret(
    ctx: click.Context,
    workspace: str,
    rotate: bool,
    overlap: str | None,
    database_url: str | None,
) -> None:
    """Print the workspace's signing secret, creating it on first use.

    Once a workspace has a secret, every http connector request of its runs carries a
    Lantern-Signature header. The secret is printed alone on stdout, so it can be piped
    into the receiver's configuration.
    """
    with_database(ctx, database_url)
    s = settings(ctx)

    async def body() -> str:
        if not workspace or len(workspace) > 100:
            raise UsageError("a workspace name is 1-100 characters")
        if overlap is not None and not rotate:
            raise UsageError("--overlap only applies with --rotate")
        try:
            overlap_s = parse_duration(overlap if overlap is not None else DEFAULT_OVERLAP)
        except ValueError as exc:
            raise UsageError(f"--overlap: {exc} (use e.g. 24h, 90m or 0)") from exc
        if overlap_s < 0:
            raise UsageError("--overlap cannot be negative")
        from lantern.effects import signing

        async with opened(s) as store:
            if not rotate:
                return await store.ensure_signing_secret(workspace, signing.new_secret())
            new = signing.new_secret()
            await store.rotate_signing_secret(workspace, new, overlap_s)
        if overlap_s > 0:
            told = overlap or DEFAULT_OVERLAP
            click.echo(f"rotated: the previous secret signs beside it for {told}", err=True)
        else:
            click.echo("rotated: the previous secret no longer signs", err=True)
        return new

    click.echo(run(body))
