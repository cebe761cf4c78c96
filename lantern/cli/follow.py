"""``lantern runs follow RUN_ID``: a run's events as they are journaled, and its model steps'
text as it is generated, until the run ends (exit 0 when it succeeded, 1 otherwise).

Against a server (``LANTERN_URL`` and ``LANTERN_API_KEY``) it reads ``GET /v1/runs/{id}/stream``
and reconnects by itself; without one it follows the local database's journal (no live text:
that exists only in the process driving the run).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import click

from lantern.cli.common import opened, remote, run, settings, with_database
from lantern.errors import NotFound

if TYPE_CHECKING:
    from lantern.sdk.stream import StreamItem

LOCAL_REREAD_S = 0.5  # the local journal is re-read this often (another process drives it)


class Printer:
    """Events one per line; live text written as it comes, under its step's name."""

    def __init__(self) -> None:
        self._open: str | None = None  # the step whose text is being written
        self.final: str | None = None  # the terminal event's kind, once seen

    def item(self, item: StreamItem) -> None:
        from lantern.engine import events as ev
        from lantern.sdk.stream import TextDelta, TextReset

        if isinstance(item, TextReset):
            self._close()
            click.echo(
                f"      {item.step_id}: attempt {item.replaces} failed; its text is replaced"
                f" by attempt {item.attempt}'s"
            )
            return
        if isinstance(item, TextDelta):
            if self._open != item.step_id:
                self._close()
                click.echo(f"      {item.step_id} ▸ ", nl=False)
                self._open = item.step_id
            click.echo(item.text, nl=False)
            return
        self._close()
        click.echo(line(item))
        if item.kind in ev.TERMINAL_KINDS:
            self.final = item.kind

    def _close(self) -> None:
        if self._open is not None:
            click.echo()
            self._open = None


def line(e: Any) -> str:
    from lantern.engine import events as ev

    where = "" if e.step_id is None else f" {e.step_id}"
    attempt = "" if not e.attempt or e.attempt == 1 else f" (attempt {e.attempt})"
    detail = ""
    if e.kind == ev.STEP_FAILED or e.kind == ev.STEP_RETRYING:
        detail = f": {(e.data.get('error') or {}).get('message', '')}"
    elif e.kind == ev.RUN_FAILED:
        detail = f": {(e.data.get('error') or {}).get('message', '')}"
    elif e.kind == ev.STEP_WAITING:
        detail = f": {e.data.get('prompt') or e.data.get('kind', '')}"
    return f"{e.seq:>5} {e.kind}{where}{attempt}{detail}"


async def _local(ctx: click.Context, run_id: str) -> AsyncIterator[StreamItem]:
    from lantern.engine import events as ev
    from lantern.sdk.models import Event

    async with opened(settings(ctx)) as store:
        if await store.get_run(run_id) is None:
            raise NotFound(f"run {run_id} not found")
        seen = 0
        with store.notifier.subscribe(run_id) as sub:
            while True:
                for e in await store.events(run_id, after=seen):
                    seen = e.seq
                    yield Event(
                        seq=e.seq,
                        run_id=e.run_id,
                        kind=e.kind,
                        at=e.at,
                        data=dict(e.data),
                        step_id=e.step_id,
                        node_id=e.node_id,
                        attempt=e.attempt,
                        hash=e.hash,
                    )
                    if e.kind in ev.TERMINAL_KINDS:
                        return
                await sub.wait(seen, timeout=LOCAL_REREAD_S)


@click.command("follow")
@click.argument("run_id")
@click.option("--database-url", help="Overrides LANTERN_DATABASE_URL.")
@click.pass_context
def follow(ctx: click.Context, run_id: str, database_url: str | None) -> None:
    """Print RUN_ID's events as they are journaled, and its model text as it is generated."""
    with_database(ctx, database_url)
    from lantern.engine import events as ev

    printer = Printer()

    async def body() -> int:
        api = remote()
        if api is not None:
            async with api:
                async for item in api.stream(run_id):
                    printer.item(item)
        else:
            async for item in _local(ctx, run_id):
                printer.item(item)
        return 0 if printer.final == ev.RUN_SUCCEEDED else 1

    raise SystemExit(run(body))
