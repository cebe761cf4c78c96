"""What routes receive: the process's store and worker, and the caller's checked API key."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from fastapi import Request

from lantern.app import App
from lantern.config import Settings
from lantern.engine.worker import Worker
from lantern.errors import Forbidden, NotFound
from lantern.receipts.issue import Issuer
from lantern.secrets.vault import Vault
from lantern.server import auth
from lantern.server.ratelimit import Limiter, Streams
from lantern.store.base import Store
from lantern.store.records import ApiKey, Run, RunDetail


@dataclass
class Services:
    store: Store
    worker: Worker
    settings: Settings
    issuer: Issuer
    vault: Vault
    limiter: Limiter
    app: App | None = None  # the user's app (--app), when the server loaded one
    # Open streams and long-polls per key (LANTERN_STREAMS_PER_KEY)
    streams: Streams = field(default_factory=lambda: Streams(256))
    verified: auth.Verified = field(default_factory=auth.Verified)  # keys verified lately

    async def authenticate(self, request: Request) -> ApiKey:
        """The request's API key (401 without a valid one), not yet checked for a scope."""
        return await auth.authenticate(
            self.store, request.headers.get("authorization"), self.verified
        )

    def knows_tool(self, workspace: str) -> Callable[[str], bool] | None:
        """Whether the loaded app registers a tool for ``workspace``, or None when no app
        with tools is loaded (an API-only replica cannot say what the executors have)."""
        app = self.app
        if app is None or not (app.tools or app.mcp_servers):
            return None
        return app.tools_for(workspace).has


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


def scope(name: str) -> Callable[[Request], Awaitable[ApiKey]]:
    """A dependency: the request's API key, which must carry ``name`` (or admin)."""

    async def check(request: Request) -> ApiKey:
        s = services(request)
        key = await s.authenticate(request)
        s.limiter.take(key.id)
        auth.require(key, name)
        return key

    check.__name__ = f"scope_{name.replace(':', '_')}"
    return check


async def owned_run(store: Store, run_id: str, key: ApiKey) -> Run:
    return _owned(run_id, key, await store.get_run(run_id))


async def owned_detail(store: Store, run_id: str, key: ApiKey) -> RunDetail:
    """``owned_run`` with the run's children and key, read with it (``Store.run_detail``)."""
    detail = await store.run_detail(run_id)
    _owned(run_id, key, None if detail is None else detail.run)
    assert detail is not None
    return detail


def _owned(run_id: str, key: ApiKey, run: Run | None) -> Run:
    if run is None:
        raise NotFound(f"run {run_id} not found")
    if run.workspace != key.workspace:
        raise Forbidden(f"run {run_id} belongs to another workspace")
    return run
