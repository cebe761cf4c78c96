"""`lantern serve`: the REST API and the executor in one process, under uvicorn."""

from __future__ import annotations

import logging
import os
import signal
import socket
from dataclasses import replace

import click

from lantern.cli.apps import app_options, load_user_app
from lantern.cli.common import fail, settings, with_database
from lantern.durations import parse_duration
from lantern.errors import LanternError
from lantern.observability import logs


@click.command()
@app_options
@click.option("--database-url", help="Overrides LANTERN_DATABASE_URL.")
@click.option("--host", help="Overrides LANTERN_HOST.")
@click.option("--port", type=click.IntRange(0, 65535), help="Overrides LANTERN_PORT.")
@click.option("--worker-id", help="Overrides LANTERN_WORKER_ID.")
@click.option("--lease-ttl", help="A Go duration; overrides LANTERN_LEASE_TTL.")
@click.option("--grace", default="30s", help="How long a clean stop waits for steps in flight.")
@click.option(
    "--log-format",
    type=click.Choice(logs.FORMATS),
    envvar="LANTERN_LOG_FORMAT",
    default="text",
    show_default=True,
    help="text for people, json (one object per line) for collectors; LANTERN_LOG_FORMAT.",
)
@click.pass_context
def serve(
    ctx: click.Context,
    app_spec: str | None,
    app_dir: str,
    database_url: str | None,
    host: str | None,
    port: int | None,
    worker_id: str | None,
    lease_ttl: str | None,
    grace: str,
    log_format: logs.LogFormat,
) -> None:
    """Serve the API and execute runs: take back this worker's runs, then queued ones."""
    import uvicorn

    from lantern.effects.egress import EgressPolicy
    from lantern.models.registry import Models
    from lantern.receipts.keys import load_ring
    from lantern.secrets import box, redact
    from lantern.server import heap
    from lantern.server.app import create_app

    with_database(ctx, database_url)
    s = settings(ctx)
    try:
        if host:
            s = replace(s, host=host)
        if port is not None:
            s = replace(s, port=port)
            if not os.environ.get("LANTERN_WORKER_ID"):
                s = replace(s, worker_id=f"{socket.gethostname()}:{port}")
        if worker_id:
            s = replace(s, worker_id=worker_id)
        if lease_ttl:
            s = replace(s, lease_ttl=parse_duration(lease_ttl))
        grace_s = parse_duration(grace)
    except ValueError as exc:
        fail(str(exc), 2)
    try:
        tools = load_user_app(app_spec, app_dir)
        Models.from_settings(s.models)  # a broken route, price or budget setting: one line
        load_ring(s)  # a bad LANTERN_SIGNING_KEY is one line here, not a startup traceback
        EgressPolicy.parse(s.egress_allow)  # and so is a bad LANTERN_EGRESS_ALLOW
        box.load(s.secrets_key, s.data_path)  # and LANTERN_SECRETS_KEY, or a readable key file
    except LanternError as exc:
        fail(str(exc), 2)
    logs.configure(log_format)
    redact.install_log_filter()  # no log line shows a secret value a step substituted
    for noisy in ("httpx", "httpx2"):  # a line per request (the model SDKs' too) drowns the rest
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("lantern").info(
        "worker %s serving %s on http://%s:%s", s.worker_id, s.database_url, s.host, s.port
    )
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(s, tools, grace=grace_s),
            host=s.host,
            port=s.port,
            access_log=False,
            # Bounds for clients that hold connections open (slowloris) or open thousands:
            # past max_connections uvicorn answers 503; headers are at most 16 KiB; an idle
            # keep-alive connection closes after 5 s. The body's read time is the Guard's.
            limit_concurrency=s.max_connections,
            h11_max_incomplete_event_size=16 * 1024,
            timeout_keep_alive=5,
            log_level="info",
            log_config=None,  # uvicorn's lines go through the handler above, in its format
            timeout_graceful_shutdown=int(grace_s) or 1,
        )
    )
    # uvicorn re-raises the stop signal after its graceful shutdown; with these handlers in
    # place that is a no-op, so a clean stop exits 0 instead of dying of SIGTERM.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    heap.settle()  # the app and every module are loaded: what is here now lives as long
    server.run()
    if not server.started:
        fail("the server did not start (see the log above)", 1)
