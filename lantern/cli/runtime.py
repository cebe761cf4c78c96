"""``lantern runtime ...``: the microVM tier's drivers, runtime nodes and VMs (CONTRACT §3)."""

from __future__ import annotations

import sys

import click
from rich.table import Table

from lantern.cli.common import console, run


@click.group()
def runtime() -> None:
    """The microVM tier: drivers, runtime nodes and their VMs."""


@runtime.command("check")
def check() -> None:
    """Which drivers work on this host, and why the others don't (exit 0 when one works)."""
    from lantern.runtime.drivers import check as check_drivers

    async def body() -> int:
        found = await check_drivers()
        table = Table("driver", "works", "isolation", "why", "seconds")
        for c in found:
            table.add_row(
                c.driver, "yes" if c.works else "no", c.isolation, c.why, f"{c.seconds:.2f}"
            )
        console().print(table)
        best = [c.driver for c in found if c.works]
        if best:
            click.echo(f"auto: {best[0]}")
            return 0
        click.echo("error: no driver works on this host", err=True)
        return 1

    sys.exit(run(body))
