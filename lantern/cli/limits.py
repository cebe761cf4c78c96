"""`lantern limits list|set|delete`: rate limits on model calls (docs/rate-limits.md).

With LANTERN_URL set each goes to that server (an admin key of its workspace; an operator key
for ``--server``); otherwise to the database, in ``--workspace``. Heavy modules are imported
inside the commands, so that `lantern --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from lantern.cli.common import (
    DEFAULT_WORKSPACE,
    guarded,
    opened,
    server_or_database,
    settings,
    with_database,
)
from lantern.cli.table import echo_columns
from lantern.errors import UsageError

if TYPE_CHECKING:
    from lantern.cli.api import Api
    from lantern.store.base import Store

Workspace = click.option(
    "--workspace", default=DEFAULT_WORKSPACE, show_default=True, help="For the database only."
)
Database = click.option("--database-url", help="Overrides LANTERN_DATABASE_URL.")
Server = click.option(
    "--server", "server", is_flag=True, help="The server's limit, on every workspace's calls."
)


@click.group()
def limits() -> None:
    """Rate limits on model calls (tokens and requests per minute), shared by every replica."""


def _act(
    ctx: click.Context, database_url: str | None, through_server: Any, on_database: Any
) -> Any:
    """``through_server(api)`` through LANTERN_URL's server, whose key decides the workspace,
    or else ``on_database(store)`` (async); what it returns."""
    with_database(ctx, database_url)
    s = settings(ctx)

    def remote(api: Api) -> Any:
        if ctx.get_parameter_source("workspace") == ParameterSource.COMMANDLINE:
            raise UsageError(
                "--workspace is for the database: through LANTERN_URL the key's workspace is used"
            )
        return through_server(api)

    async def local() -> Any:
        async with opened(s) as store:
            return await on_database(store)

    return server_or_database(remote, local)


def _definition(
    file: str | None, model: str | None, tpm: int | None, rpm: int | None, server: bool
) -> dict[str, Any]:
    """The body of ``PUT /v1/limits/NAME``: FILE's (JSON or YAML), or the options'."""
    if file is not None:
        if model is not None or tpm is not None or rpm is not None:
            raise UsageError("give FILE or --model with its counts, not both")
        import yaml

        try:
            data = yaml.safe_load(Path(file).read_text())
        except OSError as exc:
            raise UsageError(f"cannot read {file}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise UsageError(f"{file} is not JSON or YAML: {' '.join(str(exc).split())}") from exc
        if not isinstance(data, dict):
            raise UsageError(f"{file} must hold one rate limit (a JSON object)")
        return {**data, "scope": "server"} if server else data
    if model is None:
        raise UsageError("give --model GLOB (e.g. 'openai/*') or a FILE")
    body: dict[str, Any] = {"match": {"model": model}}
    if tpm is not None:
        body["tokensPerMinute"] = tpm
    if rpm is not None:
        body["requestsPerMinute"] = rpm
    if server:
        body["scope"] = "server"
    return body


@limits.command("set")
@click.argument("name")
@click.argument("file", required=False)
@click.option("--model", help="A glob over PROVIDER/MODEL the limit holds, e.g. 'openai/*'.")
@click.option("--tokens-per-minute", "tpm", type=int, help="Tokens in any 60 s.")
@click.option("--requests-per-minute", "rpm", type=int, help="Calls in any 60 s.")
@Server
@Workspace
@Database
@click.pass_context
def set_limit(
    ctx: click.Context,
    name: str,
    file: str | None,
    model: str | None,
    tpm: int | None,
    rpm: int | None,
    server: bool,
    workspace: str,
    database_url: str | None,
) -> None:
    """Create or replace the limit NAME, from FILE (as PUT /v1/limits/NAME takes it) or the
    options; prints it."""
    import json

    body = guarded(lambda: _definition(file, model, tpm, rpm, server))  # usage: one line, exit 2

    def through_server(api: Api) -> dict[str, Any]:
        from lantern.sdk.wire import parsed, seg

        return parsed(dict, api.put(f"/v1/limits/{seg(name)}", body))

    async def on_database(store: Store) -> dict[str, Any]:
        from lantern.models import limit_admin
        from lantern.models.limit_spec import parse_limit

        spec = parse_limit(body)
        return limit_admin.shown(await limit_admin.set_limit(store, workspace, name, spec))

    click.echo(json.dumps(_act(ctx, database_url, through_server, on_database), indent=2))


@limits.command("list")
@Workspace
@Database
@click.pass_context
def list_limits(ctx: click.Context, workspace: str, database_url: str | None) -> None:
    """The limits the workspace's calls are held to (its own and the server's), with what
    each one's last minute holds."""

    def through_server(api: Api) -> list[dict[str, Any]]:
        from lantern.sdk.wire import parsed

        return parsed(lambda d: [dict(item) for item in d["items"]], api.get("/v1/limits"))

    async def on_database(store: Store) -> list[dict[str, Any]]:
        from lantern.models import limit_admin

        return await limit_admin.list_limits(store, workspace)

    found = _act(ctx, database_url, through_server, on_database)
    echo_columns(
        ("name", "scope", "model", "tokens/min used", "requests/min used"),
        (
            (
                item["name"],
                item["scope"],
                item["match"]["model"],
                _fill(item["used"]["tokens"], item["tokensPerMinute"]),
                _fill(item["used"]["requests"], item["requestsPerMinute"]),
            )
            for item in found
        ),
    )


def _fill(used: int, limit: int | None) -> str:
    return f"{used} (no limit)" if limit is None else f"{used} of {limit}"


@limits.command("delete")
@click.argument("name")
@Server
@Workspace
@Database
@click.pass_context
def delete_limit(
    ctx: click.Context, name: str, server: bool, workspace: str, database_url: str | None
) -> None:
    """Delete the limit NAME (--server: the server's); calls it held are sent freely."""

    def through_server(api: Api) -> None:
        from lantern.sdk.wire import seg

        api.delete(f"/v1/limits/{seg(name)}", {"scope": "server"} if server else None)

    async def on_database(store: Store) -> None:
        from lantern.models import limit_admin

        await limit_admin.delete_limit(store, workspace, name, server)

    _act(ctx, database_url, through_server, on_database)
    click.echo(f"deleted {name}")
