"""`lantern serve`: the REST API and the executor in one process, under uvicorn."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from dataclasses import replace

import click

from lantern.cli import processes
from lantern.cli.apps import app_options, load_user_app
from lantern.cli.common import fail, settings, with_database
from lantern.config import Settings
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
    "--workers",
    type=click.IntRange(1, 64),
    envvar="LANTERN_WORKERS",
    default=1,
    show_default=True,
    help="Replicas to run, each a process of its own on this port (PostgreSQL only above 1);"
    " LANTERN_WORKERS.",
)
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
    workers: int,
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
    from lantern.server.protocol import BoundedHttpProtocol

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
    if workers > 1 and not s.database_url.startswith("postgresql"):
        # SQLite's commit notifications stay in their process: a long poll or stream on one
        # worker would not hear another's commits, and their writers would queue on one lock.
        fail("--workers above 1 needs PostgreSQL (LANTERN_DATABASE_URL=postgresql://...)", 2)
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
    log = logging.getLogger("lantern")

    def run_server(s: Settings, sockets: list[socket.socket] | None) -> bool:
        """Serve until stopped; whether the server started."""
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(s, tools, grace=grace_s),
                host=s.host,
                port=s.port,
                access_log=False,
                # Bounds for clients that hold connections open (slowloris) or open thousands:
                # past max_connections uvicorn answers 503; a request's headers are at most
                # 16 KiB (the protocol's); an idle keep-alive connection closes after 5 s. The
                # body's size and read time are the Guard's.
                http=BoundedHttpProtocol,
                limit_concurrency=s.max_connections,
                timeout_keep_alive=5,
                log_level="info",
                log_config=None,  # uvicorn's lines go through the handler above, in its format
                timeout_graceful_shutdown=int(grace_s) or 1,
            )
        )
        # Until uvicorn installs its own handlers (once its loop runs), a stop is noted on the
        # server, which then stops as soon as it has started: a SIGTERM in that window was
        # lost when these did nothing, and the server served on. uvicorn re-raises the signal
        # after its graceful shutdown, to these again: so a clean stop exits 0.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: setattr(server, "should_exit", True))
        heap.settle()  # the app and every module are loaded: what is here now lives as long
        server.run(sockets=sockets)
        return server.started

    if workers == 1:
        log.info(
            "worker %s serving %s on http://%s:%s", s.worker_id, s.database_url, s.host, s.port
        )
        if not run_server(s, None):
            fail("the server did not start (see the log above)", 1)
        return
    try:
        listening = socket.create_server(
            (s.host, s.port),
            family=socket.AF_INET6 if ":" in s.host else socket.AF_INET,
            backlog=2048,  # uvicorn's own
        )
    except OSError as exc:
        fail(f"could not listen on {s.host}:{s.port}: {exc.strerror or exc}", 1)
    log.info(
        "%d workers serving %s on http://%s:%s",
        workers,
        s.database_url,
        s.host,
        listening.getsockname()[1],
    )

    def worker(index: int) -> int:
        mine = replace(s, worker_id=processes.worker_id(s.worker_id, index))
        log.info("worker %s started (pid %d)", mine.worker_id, os.getpid())
        return 0 if run_server(mine, [listening]) else processes.NEVER_STARTED

    sys.exit(processes.supervise(workers, worker))
