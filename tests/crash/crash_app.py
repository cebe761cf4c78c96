"""The app the crash tests load with --app: a test-build hook that SIGKILLs its own process.

``LANTERN_TEST_CRASH_AFTER=step_completed:s2`` kills the process right after the commit that
journals step s2's completion, before step s3 is invoked (of the run
``LANTERN_TEST_CRASH_RUN`` only, when that is set; ``LANTERN_TEST_CRASH_SKIP=N`` lets the
first N matching commits through). The hook lives here, in the test
build, and reaches the engine only through the public ``App.on_commit`` observer.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence

import httpx
from opentelemetry import propagate

import lantern
from lantern.store import NewEvent

app = lantern.App()
# Started only when a step first names one of its tools (tests/mcp: a notes store). A stdio
# server gets only an allow-listed environment, so where it logs its calls is passed on.
app.mcp(
    "notes",
    command=[sys.executable, "-m", "tests.mcp.notes_server"],
    env={"NOTES_LOG": os.environ.get("NOTES_LOG", "")},
)
if os.environ.get("LANTERN_TEST_PRELOAD_OPENAI"):
    # Imported at start: the SDK's first import blocks the event loop (for seconds on a busy
    # machine), which a test that times leases must not mistake for a step's time.
    import openai  # noqa: F401
_CRASH_AFTER = os.environ.get("LANTERN_TEST_CRASH_AFTER", "")
_CRASH_RUN = os.environ.get("LANTERN_TEST_CRASH_RUN", "")
# Commits that match and are let through first (a run id is not known before its create).
_crash_skip = [int(os.environ.get("LANTERN_TEST_CRASH_SKIP", "0"))]


@app.on_commit
def crash_after(run_id: str, events: Sequence[NewEvent]) -> None:
    if not _CRASH_AFTER or (_CRASH_RUN and run_id != _CRASH_RUN):
        return
    kind, _, step = _CRASH_AFTER.partition(":")
    # An empty step (``run_succeeded:``) matches an event of the run as a whole.
    if any(e.kind == kind and (e.step_id or "") == step for e in events):
        if _crash_skip[0] > 0:
            _crash_skip[0] -= 1
            return
        os.kill(os.getpid(), signal.SIGKILL)


@app.tool("ping")
async def ping(ctx: lantern.ToolContext, url: str) -> dict[str, object]:
    """POST to url, as a user's tool calls a peer: the step's span is the current one, so
    OpenTelemetry's propagator puts it in the request's traceparent."""
    headers = {"Idempotency-Key": ctx.idempotency_key}
    propagate.inject(headers)
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(url, json={}, headers=headers)
    return {"status": response.status_code}


@app.tool("noop")
async def noop(**kwargs: object) -> dict[str, object]:
    return dict(kwargs)


async def _post(http: httpx.AsyncClient, url: str, key: str) -> object:
    response = await http.post(url, json={}, headers={"Idempotency-Key": key})
    response.raise_for_status()
    return response.json()


@app.tool("two_deliveries")
async def two_deliveries(ctx: lantern.ToolContext, url: str, gate_first: bool = False) -> object:
    """Two claimed deliveries; POST /gate (not a delivery) lets a test stop the tool there."""
    async with httpx.AsyncClient(timeout=60) as http:
        if gate_first:
            await http.post(f"{url}/gate")
        first = await ctx.deliver_once(
            "first", lambda: _post(http, f"{url}/first", ctx.key_for("first"))
        )
        if not gate_first:
            await http.post(f"{url}/gate")
        second = await ctx.deliver_once(
            "second", lambda: _post(http, f"{url}/second", ctx.key_for("second"))
        )
    return {"first": first, "second": second}


@app.tool("crm.lookup")
async def crm_lookup(id: str) -> dict[str, str]:
    """Find a customer by id."""
    return {"id": id, "name": "Ada"}


@app.tool("orders.list")
def orders_list(customer: str, limit: int = 10) -> list[dict[str, object]]:
    """The customer's latest orders, newest first."""
    return [{"customer": customer, "order": n} for n in range(1, min(limit, 2) + 1)]


@app.tool("sleep")
async def sleep(seconds: float, **kwargs: object) -> dict[str, object]:
    """Sleep (an async tool, so a cancellation interrupts it at once)."""
    await asyncio.sleep(seconds)
    return {"slept": seconds, **kwargs}


@app.tool("explode")
async def explode(**kwargs: object) -> dict[str, object]:
    """Raise, as a buggy tool would: its traceback belongs in the server log only."""
    raise RuntimeError(f"kaboom {sorted(kwargs)}")


@app.tool("hang")
async def hang() -> dict[str, bool]:
    """Never returns in a replica started with LANTERN_TEST_HANG=1 (one to be SIGKILLed)."""
    if os.environ.get("LANTERN_TEST_HANG") == "1":
        await asyncio.sleep(3600)
    return {"done": True}
