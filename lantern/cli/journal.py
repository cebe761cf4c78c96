"""`lantern journal verify RUN_ID`: recompute the run's hash chain and name what breaks it."""

from __future__ import annotations

from typing import Any

import click

from lantern.cli.common import opened, remote, run, settings, with_database
from lantern.errors import LanternError, NotFound


class JournalTampered(LanternError):
    pass


@click.group()
def journal() -> None:
    """The run journals: their hash chains."""


@journal.command("verify")
@click.argument("run_id")
@click.option("--database-url", help="Overrides LANTERN_DATABASE_URL.")
@click.pass_context
def verify(ctx: click.Context, run_id: str, database_url: str | None) -> None:
    """Recompute RUN_ID's hash chain; exit 1 naming the first event that does not match.

    With LANTERN_URL set the events are read from that server and the chain is recomputed
    here, so the check does not trust the server's word for it."""
    with_database(ctx, database_url)
    s = settings(ctx)

    async def body() -> None:
        events: list[Any] = []
        api = remote()
        if api is not None:
            async with api:
                await api.get_run(run_id)  # a missing run is "not found", not an empty chain
                while page := await api.events(run_id, after=events[-1].seq if events else 0):
                    events += page
        else:
            async with opened(s) as store:
                if await store.get_run(run_id) is None:
                    raise NotFound(f"run {run_id} not found")
                events = list(await store.events(run_id))
        from lantern.engine.chain import first_broken

        broken = first_broken(events)
        if broken is not None:
            seq, why = broken
            raise JournalTampered(f"journal of {run_id} does not verify at event {seq}: {why}")
        head = events[-1].hash if events else "-"
        click.echo(f"journal of {run_id} verified: {len(events)} events, head {head}")

    run(body)
