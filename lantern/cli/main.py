"""``lantern``: agents, runs and the executor from the command line.

Every command imports the parts it uses when it runs, not here: ``lantern --help`` and the
commands that only talk to a server start without the engine, the store's drivers or the web
server (tests/unit/test_cli_imports.py pins it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from lantern.cli.apps import app_options, load_user_app
from lantern.cli.common import (
    DEFAULT_WORKSPACE,
    cli_worker_id,
    colored,
    fail,
    guarded,
    opened,
    parse_json,
    server_or_database,
    settings,
    with_database,
)
from lantern.cli.table import echo_columns
from lantern.errors import DefinitionError, NotFound, UsageError

if TYPE_CHECKING:
    from lantern.cli.api import Api

DATABASE = click.option("--database-url", help="Overrides LANTERN_DATABASE_URL.")


class OneLineGroup(click.Group):
    """The root group: a usage error anywhere below it (a bad option value, a missing argument,
    an unknown command) is one ``Error: ...`` line and exit 2, without click's usage block."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            exc.ctx = None  # click prints the usage block only when it has the context
            raise


@click.group(cls=OneLineGroup)
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Lantern: durable execution for AI agents."""
    settings(ctx)


@cli.group()
def agents() -> None:
    """Agent definitions."""


@agents.command("apply")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@DATABASE
@click.pass_context
def agents_apply(ctx: click.Context, file: Path, database_url: str | None) -> None:
    """Validate FILE (JSON or YAML) and store it as the agent's next version."""
    import yaml

    with_database(ctx, database_url)
    s = settings(ctx)
    try:
        definition = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        fail(f"cannot read {file}: {' '.join(str(exc).split())}", 2)

    def through_server(api: Api) -> tuple[str, int]:
        from lantern.sdk.models import Agent
        from lantern.sdk.wire import parsed, seg

        if not isinstance(definition, dict):  # as the engine words it on a database
            raise DefinitionError(["the definition must be a JSON object"])
        name = definition.get("name")
        if not isinstance(name, str) or not name:
            raise UsageError("an agent definition needs a non-empty string 'name'")
        applied = parsed(Agent.from_json, api.put(f"/v1/agents/{seg(name)}", definition))
        return applied.name, applied.version

    async def on_database() -> tuple[str, int]:
        from lantern.engine.runs import apply_agent
        from lantern.models import router

        routes = router.configured(s.models.routes, s.models.routes_file)
        async with opened(s) as store:
            agent = await apply_agent(store, definition, routes=routes)
        return agent.name, agent.version

    name, version = server_or_database(through_server, on_database)
    click.echo(f"applied {name} v{version}")


@agents.command("list")
@DATABASE
@click.pass_context
def agents_list(ctx: click.Context, database_url: str | None) -> None:
    """The newest version of each agent."""
    with_database(ctx, database_url)
    s = settings(ctx)

    def through_server(api: Api) -> list[Any]:
        from lantern.sdk.models import Agent, Page
        from lantern.sdk.wire import parsed

        found: list[Any] = []
        cursor = None
        while True:  # every page
            data = api.get("/v1/agents", {"cursor": cursor})
            page = parsed(lambda d: Page.from_json(d, Agent.from_json), data)
            found.extend(page.items)
            if (cursor := page.next_cursor) is None:
                return found

    async def on_database() -> list[Any]:
        async with opened(s) as store:
            return list(await store.list_agents(DEFAULT_WORKSPACE))

    rows = []
    for a in server_or_database(through_server, on_database):
        code = a.definition.get("code")
        if isinstance(code, dict):  # a code-first agent: its code's version and module
            nodes = f"code {code.get('version')} ({code.get('module')})"
        else:
            nodes = str(len(a.definition.get("graph", {}).get("nodes", [])))
        rows.append((a.name, str(a.version), nodes, a.created_at.isoformat(" ", "seconds")))
    echo_columns(("name", "version", "nodes", "applied"), rows)


@cli.command("run")
@click.argument("agent")
@click.option("--input", "input_json", default="{}", help="The run's input as JSON.")
@click.option("--wait", is_flag=True, help="Execute here and print the finished run.")
@click.option(
    "--priority",
    type=click.IntRange(0, 9),
    default=None,
    help="0-9 (default 5): among queued runs that may start, higher first.",
)
@app_options
@DATABASE
@click.pass_context
def run_agent(
    ctx: click.Context,
    agent: str,
    input_json: str,
    wait: bool,
    priority: int | None,
    app_spec: str | None,
    app_dir: str,
    database_url: str | None,
) -> None:
    """Start a run of AGENT. Without --wait it is queued for `lantern serve`.

    With LANTERN_URL and LANTERN_API_KEY set the run goes to that server (--wait waits for
    it there); otherwise --wait executes it in this process.
    """
    from lantern.views import run_json

    with_database(ctx, database_url)
    s = settings(ctx)

    value = guarded(lambda: parse_json(input_json, "--input"))

    def through_server(api: Api) -> int:
        import secrets

        from lantern.sdk.models import Run
        from lantern.sdk.wire import parsed, seg

        body: dict[str, Any] = {"agentName": agent, "input": value}
        if priority is not None:
            body["priority"] = priority
        # The key makes the create safe to retry: a lost answer never starts a second run.
        key = {"Idempotency-Key": secrets.token_hex(16)}
        # With --wait the create waits too: a short run is one request.
        waiting = {"wait": 60} if wait else None
        extra = 60 if wait else 0
        answer = api.post("/v1/runs", body, headers=key, safe=True, params=waiting, extra=extra)
        submitted = parsed(Run.from_json, answer)
        if not wait:
            click.echo(submitted.id)
            return 0
        result = submitted
        while not result.finished:  # the server's long-poll answers once it is, or after 60 s
            data = api.get(f"/v1/runs/{seg(result.id)}", {"wait": 60}, extra=60)
            result = parsed(Run.from_json, data)
        click.echo(json.dumps(run_json(result), indent=2))
        return 0 if result.status == "succeeded" else 1

    async def on_database() -> int:
        from lantern.engine import own_start
        from lantern.engine.runs import create_run
        from lantern.engine.worker import Worker
        from lantern.models.registry import Models
        from lantern.receipts.issue import open_issuer

        app = load_user_app(app_spec, app_dir)
        async with opened(s) as store:
            if wait and await _isolated(store, agent):
                # This process has no runtime node to place it on: refuse before creating it.
                raise UsageError(
                    f"{agent} runs in a microVM: --wait needs a server with a runtime node"
                    " (LANTERN_URL); without --wait the run is queued for one"
                )
            # Receipts as lantern serve issues them, at each run's end (its children's too);
            # a bad LANTERN_SIGNING_KEY stops the command here, before it creates anything.
            issuer = await open_issuer(s, store) if wait else None
            created = await create_run(
                store, agent, value, app=app, priority=5 if priority is None else priority
            )
            if issuer is None:
                click.echo(created.id)
                return 0
            models = Models.from_settings(s.models)
            try:
                async with Worker(
                    store,
                    app,
                    worker_id=cli_worker_id(s),
                    lease_ttl=s.lease_ttl,
                    step_timeout=s.step_timeout,
                    models=models,
                    tool_threads=s.tool_threads,
                    issue_receipt=issuer.after_finish,
                ) as w:
                    assert w.runner is not None
                    lease = None
                    if created.flow is not None:  # started only as a claim would start it
                        lease = await own_start.slot(
                            store, created, w.worker_id, s.lease_ttl, lambda: _queued(created)
                        )
                    if created.flow is not None and lease is None:
                        finished = await own_start.settled(store, created.id)  # a server has it
                    else:
                        finished = await w.runner.drive(created.id, lease)
                    # A rate limit's wait parks the run, and no dispatcher here claims it when
                    # due: wait for it in this process and take it again as a claim would.
                    while finished is not None and finished.status == "waiting":
                        due = await own_start.throttled_until(store, created.id)
                        if due is None:
                            break  # parked at a decision, a signal, a child, a timer
                        lease = await own_start.due(
                            store, created.id, w.worker_id, s.lease_ttl, due
                        )
                        if lease is None:
                            finished = await own_start.settled(store, created.id)
                        else:
                            finished = await w.runner.drive(created.id, lease)
            finally:
                await models.aclose()
            if finished is None:
                raise NotFound(f"run {created.id} was taken over by another worker")
            # Read back: the database summed the run's model usage as it went.
            finished = await store.get_run(created.id) or finished
        click.echo(json.dumps(run_json(finished), indent=2))
        return 0 if finished.status == "succeeded" else 1

    sys.exit(server_or_database(through_server, on_database))


async def _isolated(store: Any, agent: str) -> bool:
    stored = await store.get_agent(DEFAULT_WORKSPACE, agent)
    return stored is not None and "runtime" in stored.definition


def _queued(run: Any) -> None:
    flow = run.flow
    held = f"concurrency key {flow.key!r}" if flow.key else f"agent {run.agent_name}"
    click.echo(f"run {run.id} waits for a free slot of its {held}", err=True)


@cli.group()
def runs() -> None:
    """Runs and their journals."""


@runs.command("list")
@click.option(
    "--status",
    type=click.Choice(["queued", "running", "waiting", "succeeded", "failed", "cancelled"]),
)
@click.option("--agent", "agent_name")
@click.option("--limit", type=click.IntRange(1, 1000), default=20)
@DATABASE
@click.pass_context
def runs_list(
    ctx: click.Context, status: Any, agent_name: str | None, limit: int, database_url: str | None
) -> None:
    """Runs, newest first."""
    with_database(ctx, database_url)
    s = settings(ctx)

    def through_server(api: Api) -> list[Any]:
        from lantern.sdk.models import Page, Run
        from lantern.sdk.wire import parsed

        data = api.get("/v1/runs", {"status": status, "agentName": agent_name, "limit": limit})
        return list(parsed(lambda d: Page.from_json(d, Run.from_json), data).items)

    async def on_database() -> list[Any]:
        async with opened(s) as store:
            return list(
                await store.list_runs(
                    DEFAULT_WORKSPACE, status=status, agent_name=agent_name, limit=limit
                )
            )

    echo_columns(
        ("id", "agent", "status", "created", "updated"),
        (
            (
                r.id,
                f"{r.agent_name} v{r.agent_version}",
                r.status,
                r.created_at.isoformat(" ", "seconds"),
                r.updated_at.isoformat(" ", "seconds"),
            )
            for r in server_or_database(through_server, on_database)
        ),
    )


@runs.command("show")
@click.argument("run_id")
@DATABASE
@click.pass_context
def runs_show(ctx: click.Context, run_id: str, database_url: str | None) -> None:
    """The run's waterfall: a row per step, with what the journal replayed."""
    from lantern import waterfall

    with_database(ctx, database_url)
    s = settings(ctx)

    def through_server(api: Api) -> tuple[Any, Any, Any]:
        from lantern.sdk.models import Delivery, EventPage, Run
        from lantern.sdk.wire import parsed, seg

        path = f"/v1/runs/{seg(run_id)}"
        got = parsed(Run.from_json, api.get(path))
        journal = parsed(EventPage.from_json, api.get(f"{path}/events", {"after": 0})).items
        data = api.get(f"{path}/deliveries")
        sent = parsed(lambda d: [Delivery.from_json(item) for item in d["items"]], data)
        return got, journal, sent

    async def on_database() -> tuple[Any, Any, Any]:
        async with opened(s) as store:
            found = await store.get_run(run_id)
            if found is None:
                raise NotFound(f"run {run_id} not found")
            return found, await store.events(run_id), await store.deliveries(run_id)

    found, events, sent = server_or_database(through_server, on_database)
    waterfall.render(found, events, click.echo, sent, color=colored())


@runs.command("resume")
@click.argument("run_id")
@click.option("--version", "version", required=True, help="The code version to go on with.")
@DATABASE
@click.pass_context
def runs_resume(ctx: click.Context, run_id: str, version: str, database_url: str | None) -> None:
    """Move a code-first run waiting for a version of its code onto VERSION (when you
    know the new code replays its journal)."""
    with_database(ctx, database_url)
    s = settings(ctx)

    def through_server(api: Api) -> Any:
        from lantern.sdk.models import Run
        from lantern.sdk.wire import parsed, seg

        data = api.post(f"/v1/runs/{seg(run_id)}/resume", {"version": version})
        return parsed(Run.from_json, data)

    async def on_database() -> Any:
        from lantern.engine.resume import resume_run

        async with opened(s) as store:
            return await resume_run(store, run_id, version, cli_worker_id(s), s.lease_ttl)

    moved = server_or_database(through_server, on_database)
    click.echo(f"{moved.id} {moved.status}: pinned to version {version}")


@cli.command()
@click.argument("story", required=False, type=click.Choice(["microvm"]))
@click.option(
    "--workdir", type=click.Path(file_okay=False, path_type=Path), default=Path(".lantern/demo")
)
def demo(story: str | None, workdir: Path) -> None:
    """The crash-and-resume story, offline: what `make demo` runs.

    `lantern demo microvm`: a microVM run whose runtime node is SIGKILLed mid-step, resumed
    on another runtime node with LANTERN_RESUME=1.
    """
    if story == "microvm":
        from lantern.demo.microvm import tell as tell_microvm

        sys.exit(tell_microvm(workdir / "microvm"))
    from lantern.demo.story import tell

    sys.exit(tell(workdir))


def main() -> None:
    # httpx imports its own command line whenever click and rich are installed, as they are
    # here, and with it pygments, rich.syntax and rich.progress: a fifth of a remote command's
    # start. Lantern never runs it; httpx falls back to a stub when the import fails.
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    from lantern.cli import (
        follow,
        journal,
        keys,
        limits,
        operate,
        receipts,
        runtime,
        schedules,
        secrets,
        serve,
        webhooks,
        workers,
    )

    cli.add_command(serve.serve)
    cli.add_command(keys.keys)
    cli.add_command(workers.workers)
    cli.add_command(webhooks.webhooks)
    cli.add_command(secrets.secrets)
    cli.add_command(schedules.schedules)
    cli.add_command(limits.limits)
    cli.add_command(journal.journal)
    cli.add_command(receipts.receipt)
    cli.add_command(runtime.runtime)
    cli.add_command(runtime.node)
    runs.add_command(receipts.export_command)
    runs.add_command(follow.follow)
    operate.install(runs, cli)
    cli(prog_name="lantern")
