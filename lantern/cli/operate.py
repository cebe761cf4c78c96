"""Acting on runs: ``lantern runs approve|reject|cancel|retry|signal`` and ``lantern approvals
list``.

Each goes to the server named by ``LANTERN_URL`` (with ``LANTERN_API_KEY``) when one is set,
and otherwise acts on the database directly, as the other ``runs`` commands do. A decision
made through the server carries the key's id and name into the journal; one made on the
database directly carries ``cli:<user>``.
"""

from __future__ import annotations

import getpass
import json
import re
from typing import TYPE_CHECKING, Any, Literal

import click

from lantern.cli.common import (
    DEFAULT_WORKSPACE,
    cli_worker_id,
    guarded,
    opened,
    server_or_database,
    settings,
    with_database,
)
from lantern.cli.table import echo_columns
from lantern.errors import Conflict, NotFound, UsageError

if TYPE_CHECKING:
    from lantern.cli.api import Api

_RUN_ID = re.compile(r"^run_[0-9a-f]{28}$")
MAX_COMMENT = 10_000


class OneLine(click.Command):
    """A command whose usage errors are one line (``Error: ...``) and exit 2, as every
    lantern command does, instead of the usage text and a hint around it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            exc.ctx = None  # click prints the usage block only when it has the context
            raise


def checked_run_id(run_id: str) -> str:
    if not _RUN_ID.match(run_id):
        raise UsageError(f"{run_id!r} is not a run id (run ids look like run_0193c4f0a1b2...)")
    return run_id


DATABASE = click.option("--database-url", help="Overrides LANTERN_DATABASE_URL.")
COMMENT = click.option("--comment", help="Why; kept with the decision in the journal.")


def decision_command(verb: Literal["approve", "reject"]) -> click.Command:
    @click.command(verb, cls=OneLine)
    @click.argument("run_id")
    @click.argument("node", required=False)
    @COMMENT
    @DATABASE
    @click.pass_context
    def command(
        ctx: click.Context,
        run_id: str,
        node: str | None,
        comment: str | None,
        database_url: str | None,
    ) -> None:
        with_database(ctx, database_url)
        s = settings(ctx)

        def checked() -> None:
            checked_run_id(run_id)
            if comment is not None and len(comment) > MAX_COMMENT:
                raise UsageError(f"--comment is longer than {MAX_COMMENT} characters")

        guarded(checked)

        def through_server(api: Api) -> None:
            from lantern.sdk.errors import InvalidResponse
            from lantern.sdk.wire import seg

            step = node or _only(
                run_id, [p["nodeId"] for p in _pending(api, 500) if p.get("runId") == run_id]
            )
            body: dict[str, Any] = {"decision": verb}
            if comment is not None:
                body["comment"] = comment
            made = api.post(f"/v1/runs/{seg(run_id)}/approvals/{seg(step)}", body)
            if not isinstance(made, dict) or "decision" not in made:
                raise InvalidResponse(f"unexpected answer to a decision: {made!r}")
            who = made.get("decidedByName") or made.get("decidedBy")
            click.echo(f"{made['decision']} {run_id} at {step} (by {who})")

        async def on_database() -> None:
            from lantern.engine.approvals import decide

            async with opened(s) as store:
                found = await store.get_run(run_id)
                if found is None:
                    raise NotFound(f"run {run_id} not found")
                step = node or _only(
                    run_id,
                    [
                        p.node_id
                        for p in await store.pending_approvals(found.workspace, 500)
                        if p.run_id == run_id
                    ],
                )
                decision: Literal["approved", "rejected"] = (
                    "approved" if verb == "approve" else "rejected"
                )
                who = f"cli:{getpass.getuser()}"
                await decide(store, found, step, decision, who, comment)
            click.echo(f"{decision} {run_id} at {step} (by {who})")

        server_or_database(through_server, on_database)

    command.help = (
        f"{verb.capitalize()} RUN_ID parked at approval NODE (the one it waits on, when it waits"
        " on one). The run resumes on whichever replica claims it."
    )
    return command


def _pending(api: Api, limit: int) -> list[dict[str, Any]]:
    """The workspace's pending approvals as the API gives them, oldest first."""
    from lantern.sdk.wire import parsed

    data = api.get("/v1/approvals", {"status": "pending", "limit": limit})
    return parsed(lambda d: [dict(item) for item in d["items"]], data)


def _only(run_id: str, nodes: list[str]) -> str:
    if not nodes:
        raise Conflict(f"run {run_id} is not waiting for a decision")
    if len(nodes) > 1:
        raise UsageError(f"run {run_id} waits at {', '.join(nodes)}: name the NODE to decide")
    return nodes[0]


@click.command("cancel", cls=OneLine)
@click.argument("run_id")
@DATABASE
@click.pass_context
def cancel(ctx: click.Context, run_id: str, database_url: str | None) -> None:
    """Cancel a queued, running or waiting run (and the runs its sub-agents started).

    A running run is stopped by the replica executing it: an async step in flight is
    cancelled at once, a sync tool (in a thread) at its end."""
    with_database(ctx, database_url)
    s = settings(ctx)

    guarded(lambda: checked_run_id(run_id))

    def through_server(api: Api) -> str:
        from lantern.sdk.wire import parsed, seg

        return parsed(lambda d: str(d["status"]), api.post(f"/v1/runs/{seg(run_id)}/cancel"))

    async def on_database() -> str:
        from lantern.engine.cancel import cancel_run

        async with opened(s) as store:
            found = await cancel_run(store, run_id, cli_worker_id(s), s.lease_ttl)
        return found.status

    status = server_or_database(through_server, on_database)
    state = "cancelled" if status == "cancelled" else "cancel requested"
    click.echo(f"{state}: {run_id} ({status})")


@click.command("retry", cls=OneLine)
@click.argument("run_id")
@click.option("--from", "from_step", metavar="STEP", help="Run this step and what follows again.")
@DATABASE
@click.pass_context
def retry(ctx: click.Context, run_id: str, from_step: str | None, database_url: str | None) -> None:
    """A new run of failed or cancelled RUN_ID's agent version: its completed steps before
    STEP (all of them, without --from) are replayed from the journal, the rest run again with
    fresh idempotency keys. Prints the new run's id."""
    with_database(ctx, database_url)
    s = settings(ctx)

    def checked() -> None:
        checked_run_id(run_id)
        if from_step is not None and not from_step.strip():
            raise UsageError("--from needs a step id")

    guarded(checked)

    def through_server(api: Api) -> str:
        from lantern.sdk.wire import parsed, seg

        body = {} if from_step is None else {"fromStep": from_step}
        made = api.post(f"/v1/runs/{seg(run_id)}/retry", body)
        return parsed(lambda d: str(d["id"]), made)

    async def on_database() -> str:
        from lantern.engine.rerun import retry_run
        from lantern.models import router

        async with opened(s) as store:
            found = await store.get_run(run_id)
            if found is None:
                raise NotFound(f"run {run_id} not found")
            routes = router.configured(s.models.routes, s.models.routes_file)
            made = await retry_run(store, found, from_step, routes=routes)
        return made.id

    click.echo(server_or_database(through_server, on_database))


@click.command("signal", cls=OneLine)
@click.argument("run_id")
@click.argument("name")
@click.option("--payload", default="null", show_default=True, help="The signal's payload (JSON).")
@click.option("--idempotency-key", help="The same key again sends one signal, not two.")
@DATABASE
@click.pass_context
def signal(
    ctx: click.Context,
    run_id: str,
    name: str,
    payload: str,
    idempotency_key: str | None,
    database_url: str | None,
) -> None:
    """Send the signal NAME to RUN_ID (docs/signals.md): the run's first wait for NAME, now
    or later, takes it. Prints the signal's id once it is stored."""
    with_database(ctx, database_url)
    s = settings(ctx)

    def checked() -> Any:
        checked_run_id(run_id)
        try:
            return json.loads(payload)
        except ValueError as exc:
            raise UsageError(f"--payload is not JSON: {exc}") from None

    value = guarded(checked)

    def through_server(api: Api) -> str:
        import secrets

        from lantern.sdk.wire import parsed, seg

        # Always a key (a random one unless given), so a lost answer is retried as one signal.
        key = {"Idempotency-Key": idempotency_key or secrets.token_hex(16)}
        path = f"/v1/runs/{seg(run_id)}/signals/{seg(name)}"
        answer = api.post(path, {"payload": value}, headers=key, safe=True)
        return parsed(lambda d: str(d["id"]), answer)

    async def on_database() -> str:
        from lantern.engine.signals import send

        async with opened(s) as store:
            found = await store.get_run(run_id)
            if found is None:
                raise NotFound(f"run {run_id} not found")
            made = await send(store, found, name, value, idempotency_key)
        return made.id

    click.echo(f"sent: {server_or_database(through_server, on_database)} ({name} to {run_id})")


@click.group()
def approvals() -> None:
    """Approvals that runs wait on."""


@approvals.command("list", cls=OneLine)
@click.option("--limit", type=click.IntRange(1, 500), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@DATABASE
@click.pass_context
def approvals_list(ctx: click.Context, limit: int, as_json: bool, database_url: str | None) -> None:
    """The workspace's pending approvals, oldest first: run, node, prompt, waiting since."""
    with_database(ctx, database_url)
    s = settings(ctx)

    def through_server(api: Api) -> list[Any]:
        from lantern.sdk.models import PendingApproval
        from lantern.sdk.wire import parsed

        return parsed(lambda d: [PendingApproval.from_json(i) for i in d], _pending(api, limit))

    async def on_database() -> list[Any]:
        async with opened(s) as store:
            return list(await store.pending_approvals(DEFAULT_WORKSPACE, limit))

    found = server_or_database(through_server, on_database)
    if as_json:
        for p in found:
            item = {
                "runId": p.run_id,
                "nodeId": p.node_id,
                "agentName": p.agent_name,
                "prompt": p.prompt,
                "since": p.since.isoformat(),
            }
            click.echo(json.dumps(item))
        return
    if not found:
        click.echo("no pending approvals")
        return
    echo_columns(
        ("run", "node", "agent", "prompt", "since"),
        (
            (p.run_id, p.node_id, p.agent_name, p.prompt or "", p.since.isoformat(" ", "seconds"))
            for p in found
        ),
    )


def install(runs: click.Group, cli: click.Group) -> None:
    """Add these commands to ``lantern runs`` and ``lantern``."""
    runs.add_command(decision_command("approve"))
    runs.add_command(decision_command("reject"))
    runs.add_command(cancel)
    runs.add_command(retry)
    runs.add_command(signal)
    cli.add_command(approvals)
