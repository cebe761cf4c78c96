"""`lantern workers list`: the replicas, their last heartbeat and the runs they hold."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from lantern.cli.common import console, opened, remote, run, settings, with_database


@click.group()
def workers() -> None:
    """The replicas sharing this database."""


@workers.command("list")
@click.option("--database-url", help="Overrides LANTERN_DATABASE_URL.")
@click.pass_context
def list_workers(ctx: click.Context, database_url: str | None) -> None:
    """Each replica's id, last heartbeat and the runs it holds leases on.

    With LANTERN_URL set it asks that server (the key needs the admin scope)."""
    from rich.table import Table

    with_database(ctx, database_url)
    s = settings(ctx)

    async def body() -> None:
        found: list[Any]
        api = remote()
        if api is not None:
            async with api:
                found = await api.workers()
        else:
            async with opened(s) as store:
                found = list(await store.list_workers())
        now = datetime.now(UTC)
        table = Table("worker", "started", "last heartbeat", "state", "runs held")
        for w in found:
            ago = (now - w.heartbeat_at).total_seconds()
            state = "stopped" if w.stopped_at else f"heartbeat {ago:.0f}s ago"
            table.add_row(
                w.id,
                w.started_at.isoformat(" ", "seconds"),
                w.heartbeat_at.isoformat(" ", "seconds"),
                state,
                ", ".join(w.runs) or "-",
            )
        console().print(table)

    run(body)
