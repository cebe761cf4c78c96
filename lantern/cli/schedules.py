"""`lantern schedules apply FILE|list|show|pause|resume|trigger|delete` (docs/schedules.md).

With LANTERN_URL set each goes to that server (the API key's workspace); otherwise to the
database, in ``--workspace``. Heavy modules are imported inside the commands, so that
`lantern --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from lantern.cli.common import DEFAULT_WORKSPACE, opened, remote, run, settings, with_database
from lantern.errors import UsageError

if TYPE_CHECKING:
    from lantern.store.base import Store

Workspace = click.option("--workspace", default=DEFAULT_WORKSPACE, show_default=True)
Database = click.option("--database-url", help="Overrides LANTERN_DATABASE_URL.")


@click.group()
def schedules() -> None:
    """Schedules that start runs on a cron or every interval."""


def _read(path: str) -> tuple[str, dict[str, Any]]:
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"{path} is not JSON or YAML: {' '.join(str(exc).split())}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise UsageError(f"{path} must hold one schedule with a name")
    return data.pop("name"), data


def _apply(ctx: click.Context, workspace: str, database_url: str | None, act: Any) -> None:
    """Run ``act(api, store)`` with one of them set; print what it returns as JSON."""
    with_database(ctx, database_url)
    s = settings(ctx)

    async def body() -> None:
        api = remote()
        if api is not None:
            async with api:
                out = await act(api, None)
        else:
            async with opened(s) as store:
                out = await act(None, store)
        if out is not None:
            click.echo(json.dumps(out, indent=2))

    run(body)


async def _local_show(store: Store, workspace: str, name: str) -> dict[str, Any]:
    from lantern.errors import NotFound
    from lantern.store.schedules import schedule_json

    found = await store.get_schedule(workspace, name)
    if found is None:
        raise NotFound(f"schedule {name!r} not found")
    return schedule_json(found)


@schedules.command("apply")
@click.argument("file")
@Workspace
@Database
@click.pass_context
def apply(ctx: click.Context, file: str, workspace: str, database_url: str | None) -> None:
    """Create or replace the schedule FILE (JSON or YAML) defines."""
    name, definition = _read(file)

    async def act(api: Any, store: Store | None) -> Any:
        if api is not None:
            return await api.put_schedule(name, definition)
        from lantern.engine.schedules import apply_schedule
        from lantern.store.schedules import schedule_json

        assert store is not None
        return schedule_json(await apply_schedule(store, workspace, name, definition))

    _apply(ctx, workspace, database_url, act)


@schedules.command("list")
@Workspace
@Database
@click.pass_context
def list_schedules(ctx: click.Context, workspace: str, database_url: str | None) -> None:
    """The schedules by name, with their next fire time."""

    async def act(api: Any, store: Store | None) -> None:
        if api is not None:
            found = await api.schedules()
        else:
            from lantern.store.schedules import schedule_json

            assert store is not None
            found = [schedule_json(s) for s in await store.list_schedules(workspace)]
        for s in found:
            timing = s.get("cron") or f"every {s.get('every')}"
            state = "paused" if s["paused"] else f"next {s['nextFireAt']}"
            click.echo(f"{s['name']}\t{s['agentName']}\t{timing} {s['timezone']}\t{state}")

    _apply(ctx, workspace, database_url, act)


@schedules.command("show")
@click.argument("name")
@Workspace
@Database
@click.pass_context
def show(ctx: click.Context, name: str, workspace: str, database_url: str | None) -> None:
    """The schedule NAME as JSON."""

    async def act(api: Any, store: Store | None) -> Any:
        if api is not None:
            return await api.schedule(name)
        assert store is not None
        return await _local_show(store, workspace, name)

    _apply(ctx, workspace, database_url, act)


def _pausing(paused: bool) -> Any:
    @click.argument("name")
    @Workspace
    @Database
    @click.pass_context
    def command(ctx: click.Context, name: str, workspace: str, database_url: str | None) -> None:
        async def act(api: Any, store: Store | None) -> Any:
            if api is not None:
                current = await api.schedule(name)
                keep = ("agentName", "input", "cron", "every", "timezone", "overlap", "catchup")
                body = {k: current[k] for k in keep if k in current}
                return await api.put_schedule(name, {**body, "paused": paused})
            from lantern.engine.schedules import set_paused
            from lantern.store.schedules import schedule_json

            assert store is not None
            return schedule_json(await set_paused(store, workspace, name, paused))

        _apply(ctx, workspace, database_url, act)

    return command


schedules.command("pause", help="Stop NAME's fires until it is resumed.")(_pausing(True))
schedules.command("resume", help="Fire NAME again (its catchup decides the missed times).")(
    _pausing(False)
)


@schedules.command("trigger")
@click.argument("name")
@Workspace
@Database
@click.pass_context
def trigger_now(ctx: click.Context, name: str, workspace: str, database_url: str | None) -> None:
    """Start NAME's run now; prints the run id (a server drives it)."""

    async def act(api: Any, store: Store | None) -> None:
        if api is not None:
            run_ = await api.trigger_schedule(name)
            click.echo(run_.id)
            return
        from lantern.engine.schedules import trigger

        assert store is not None
        click.echo((await trigger(store, workspace, name)).id)

    _apply(ctx, workspace, database_url, act)


@schedules.command("delete")
@click.argument("name")
@Workspace
@Database
@click.pass_context
def delete(ctx: click.Context, name: str, workspace: str, database_url: str | None) -> None:
    """Delete NAME (its runs stay)."""

    async def act(api: Any, store: Store | None) -> None:
        if api is not None:
            await api.delete_schedule(name)
        else:
            from lantern.errors import NotFound

            assert store is not None
            if not await store.delete_schedule(workspace, name):
                raise NotFound(f"schedule {name!r} not found")
        click.echo(f"deleted {name}")

    _apply(ctx, workspace, database_url, act)
