"""The ASGI app: routes, problem+json errors, the body limit, and the executor's lifespan.

The app owns its store and worker: on start it opens the store and starts the worker (which
takes back its own runs, then claims queued ones); on shutdown it stops taking runs, lets
steps in flight finish within the grace period, releases leases and closes the store.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp

from lantern import __version__
from lantern.app import App
from lantern.config import Settings
from lantern.effects.egress import EgressPolicy
from lantern.engine.retention import RetentionLoop
from lantern.engine.worker import Worker
from lantern.models.registry import Models
from lantern.observability import tracing
from lantern.receipts.batch import ReceiptBatcher
from lantern.receipts.issue import open_issuer
from lantern.runtime.relay import Relay
from lantern.runtime.scheduler import Scheduler
from lantern.secrets import box
from lantern.secrets.vault import Vault
from lantern.server import problems
from lantern.server.deps import Services
from lantern.server.limits import Guard
from lantern.server.openapi import document
from lantern.server.ratelimit import Limiter, Streams
from lantern.server.routes import (
    agents,
    health,
    limits,
    operate,
    outputs,
    receipts,
    runs,
    runtime,
    schedules,
    secrets,
    stream,
    ui,
    workers,
    workspace,
)
from lantern.store.base import open_store


def _telemetry() -> dict[str, Any]:
    """FastAPI's own OpenTelemetry (from 0.165), which follows the tracer provider Lantern
    installs: a span per HTTP request, kept (docs/observability.md); not its spans around
    dependency resolution, the endpoint and serialization inside each request (five more per
    request, a tenth of a short run's server time) nor its metrics (Lantern's are
    Prometheus's) nor its OpenTelemetry log records of failed requests: Lantern installs no
    OpenTelemetry logger provider (its logs are lines, docs/observability.md, and a request
    that fails unexpectedly is logged there), and asking for one cost each request a look
    through the environment."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"operation_spans": False, "metrics": False, "logs": False}}


def create_app(settings: Settings, tools: App, *, grace: float = 30.0) -> ASGIApp:
    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        tracing.configure(settings.worker_id, settings.trace_export)
        # Checked by `lantern serve` before it starts: a broken setting does not get here.
        models = Models.from_settings(settings.models)
        store = open_store(settings.database_url)
        await store.open()
        issuer = await open_issuer(settings, store)
        # Finished runs' receipts, issued off the runs' critical path; left after the worker
        # (below), so it issues those of the runs finished while the worker stopped.
        batcher = ReceiptBatcher(issuer)
        scheduler = Scheduler(
            store,
            worker_id=settings.worker_id,
            node_ttl=settings.node_ttl,
            lease_ttl=settings.lease_ttl,
            workspace_slots=settings.vm_workspace_slots,
            listeners=tools.commit_listeners,
        )
        relay = Relay(
            store,
            listeners=tools.commit_listeners,
            finished=batcher.submit,
            patience=settings.lease_ttl,
            app=tools,
            models=models,
            max_output_bytes=settings.max_output_bytes,
        )
        api.state.runtime = (scheduler, relay)
        vault = Vault(store, box.load(settings.secrets_key, settings.data_path))
        worker = Worker(
            store,
            tools,
            worker_id=settings.worker_id,
            lease_ttl=settings.lease_ttl,
            max_concurrent=settings.max_concurrent_runs,
            recovery_interval=settings.recovery_interval,
            max_recoveries=settings.max_recoveries,
            issue_receipt=batcher.submit,
            step_timeout=settings.step_timeout,
            egress=EgressPolicy.parse(settings.egress_allow),
            vault=vault,
            microvm=scheduler.adopt,
            models=models,
            tool_threads=settings.tool_threads,
            max_output_bytes=settings.max_output_bytes,
        )
        relay.on_queued = worker.wake  # a VM's ctx.run_agent queued a child run here
        store.notifier.driven_here = worker.drives  # its runs' commits need no NOTIFY to be heard
        relay.live = worker.live  # a VM's ctx.live_text, to this process's followers
        async with batcher, worker:
            assert worker.runner is not None
            # A VM run's anomalies are counted with this process's in-process runs.
            relay.drives.retry_rates = worker.runner.retry_rates
            relay.drives.baselines = worker.runner.baselines
            api.state.services = Services(
                store,
                worker,
                settings,
                issuer,
                vault,
                Limiter(settings.rate_limit),
                tools,
                streams=Streams(settings.streams_per_key),
            )
            serving = asyncio.create_task(worker.serve(), name="lantern-dispatcher")
            scheduling = asyncio.create_task(
                scheduler.run(worker.stopping), name="lantern-scheduler"
            )
            retention = RetentionLoop(
                store,
                worker_id=settings.worker_id,
                default_s=settings.retention,
                interval=settings.recovery_interval,
            )
            retaining = asyncio.create_task(
                retention.run(worker.stopping), name="lantern-retention"
            )
            try:
                yield
            finally:
                await worker.stop(grace)
                await serving
                await scheduling
                await retaining
        await models.aclose()  # the model providers' SDK clients
        await tools.aclose()  # the MCP servers this process started
        await store.close()
        tracing.shutdown()  # flushes the spans still batched

    api = FastAPI(
        title="Lantern",
        version=__version__,
        description="Durable execution for AI agents: the REST API of `lantern serve`.",
        lifespan=lifespan,
        **_telemetry(),
    )
    problems.install(api)
    routers = (runs, outputs, stream, agents, secrets, schedules, limits, workers, workspace)
    for module in (*routers, health, receipts, runtime, ui, operate):
        # The routes themselves, not ``include_router``: FastAPI (0.165 here) wraps an included
        # router, and every request was matched through each wrapper twice, re-reading every
        # router's routes (a fifth of a light request's CPU). The routers' routes carry their
        # prefix, tags and responses already, and none is included with options of its own.
        api.router.routes.extend(module.router.routes)
    api.mount("/ui/static", ui.static, name="ui-static")
    api.openapi = lambda: document(api)  # type: ignore[method-assign]
    return Guard(api, settings.max_body_bytes, settings.body_timeout)
