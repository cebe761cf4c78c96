"""/v1/runs: create, read, list, follow, cancel, approvals and signals."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.responses import JSONResponse

from lantern.engine.approvals import decide
from lantern.engine.cancel import cancel_run
from lantern.engine.resume import resume_run
from lantern.engine.runs import create_run
from lantern.engine.schedules import schedule_of_key
from lantern.engine.signals import NAME, send
from lantern.errors import UsageError
from lantern.server.deps import owned_detail, owned_run, scope, services
from lantern.server.ratelimit import StreamsExceeded
from lantern.server.schemas import (
    PROBLEMS,
    CreateRun,
    Decision,
    DecisionOut,
    DeliveryList,
    EventPage,
    Resume,
    RunOut,
    RunPage,
    SendSignal,
    SignalOut,
)
from lantern.store.base import Store
from lantern.store.notify import Subscription
from lantern.store.records import ApiKey, Event, Run, RunDetail
from lantern.store.schedules import SCHEDULE_KEYS
from lantern.views import delivery_json, event_json, run_json

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=PROBLEMS)
REREAD_S = 2.0  # a waiter re-reads at least this often, notified or not
SETTLE_S = 0.05  # a waiter that heard of the end but read the run unfinished reads again after

Status = Literal["queued", "running", "waiting", "succeeded", "failed", "cancelled"]


def encode_cursor(value: str) -> str:
    return base64.urlsafe_b64encode(value.encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> str | None:
    if cursor is None:
        return None
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        value = base64.b64decode(padded, altchars=b"-_", validate=True).decode()
        if "\x00" in value:
            raise ValueError("NUL")
        return value
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError("cursor is not one this API gave out") from exc


@router.post(
    "",
    status_code=202,
    response_model=RunOut,
    responses={200: {"model": RunOut, "description": "The run finished within ?wait"}},
)
async def create(
    body: CreateRun,
    request: Request,
    key: Annotated[ApiKey, Depends(scope("runs:execute"))],
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=255)] = None,
    wait: Annotated[float, Query(ge=0, le=60)] = 0,
) -> JSONResponse:
    """Create a run (202, queued); with ``?wait=SECONDS``, answer when it finished within that
    many seconds (200, the finished run, as ``GET ?wait`` gives it), else as it stands then
    (202): one request instead of two for a short run."""
    if idempotency_key is not None and idempotency_key.startswith(SCHEDULE_KEYS):
        # Schedules' own namespace: a client's key there could take a fire time's run.
        raise UsageError(
            f"Idempotency-Key may not start with {SCHEDULE_KEYS!r}: schedules' fires use those"
        )
    s = services(request)
    # This replica's claims pass the new run by until take() below has it (nothing awaited
    # in between): committed queued, it would be claimed too, a lease its drive then
    # supersedes.
    with s.worker.creating() as run_id:
        run = await create_run(
            s.store,
            body.agentName,
            body.input,
            key.workspace,
            idempotency_key=idempotency_key,
            run_id=run_id,
            app=s.worker.app,
            priority=body.priority,
            # A waiter gets the run once it ends: a run this replica drives is stored with
            # its lease and opening in one commit (not for the 202 at once: the opening
            # waits for the run's first step).
            start=s.worker.start_new if wait else None,
        )
    try:
        # The wait holds a connection as a long-poll does; a key holding all it may (the
        # streams limit) gets its run at once instead of a 429 for a run it has made.
        release = s.streams.take(key.id) if wait else None
    except StreamsExceeded:
        release = None
    if release is None:
        s.worker.take(run)
        return JSONResponse(run_json(run), status_code=202)
    try:
        with s.store.notifier.subscribe(run.id) as sub:
            # Subscribed before the run is handed on, so its end is heard. A queued run (ours,
            # just made, or an earlier one an Idempotency-Key named) needs no second read, nor
            # does ours started here (``start_new``): it is as its opening commit stored it
            # unless it ended since, and an end committed here before this subscription is
            # remembered by the notifier, so the subscription starts out ``finished`` (then
            # read). An earlier run the key named may have moved on since it was read.
            s.worker.take(run)
            read = run.status != "queued" and run.id != run_id
            detail = await finished_within(s.store, key, run, sub, wait, read=read)
    finally:
        release()
    if not detail.run.finished:
        return JSONResponse(run_json(detail.run), status_code=202)
    return JSONResponse({**run_json(detail.run), "children": detail.children})


@router.get("", response_model=RunPage)
async def list_runs(
    request: Request,
    key: Annotated[ApiKey, Depends(scope("runs:read"))],
    status: Status | None = None,
    agentName: Annotated[str | None, Query(max_length=100)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    schedule: Annotated[str | None, Query(min_length=1, max_length=100)] = None,
) -> dict[str, Any]:
    store = services(request).store
    if schedule is not None:  # the runs a schedule's fires created (docs/schedules.md)
        runs = await store.schedule_runs(
            key.workspace,
            schedule,
            status=status,
            agent_name=agentName,
            limit=limit + 1,
            before=decode_cursor(cursor),
        )
    else:
        runs = await store.list_runs(
            key.workspace,
            status=status,
            agent_name=agentName,
            limit=limit + 1,
            before=decode_cursor(cursor),
        )
    more = len(runs) > limit
    runs = runs[:limit]
    return {
        "items": [run_json(r) for r in runs],
        "nextCursor": encode_cursor(runs[-1].id) if more else None,
    }


@router.get("/{run_id}", response_model=RunOut)
async def get(
    run_id: str,
    request: Request,
    key: Annotated[ApiKey, Depends(scope("runs:read"))],
    wait: Annotated[float, Query(ge=0, le=60)] = 0,
) -> JSONResponse:
    s = services(request)
    store = s.store
    if not wait:
        detail = await owned_detail(store, run_id, key)
    else:
        # Subscribed, then read: the run's end is heard however soon it comes, and the wait
        # needs no second read before it sleeps.
        with store.notifier.subscribe(run_id) as sub:
            detail = await owned_detail(store, run_id, key)
            if not detail.run.finished:
                with s.streams.hold(key.id):  # a long-poll holds a connection as a stream does
                    detail = await finished_within(store, key, detail.run, sub, wait, read=False)
    # A ready response, not a dict for ``response_model`` to validate again: the body is
    # ``run_json`` of the store's record, the shape RunOut describes, and checking it once more
    # on every read (the call a client waiting on a run makes) bought nothing for its cost.
    return JSONResponse(
        {
            **run_json(detail.run),
            "children": detail.children,
            "schedule": schedule_of_key(detail.idempotency_key),
        }
    )


async def finished_within(
    store: Store, key: ApiKey, run: Run, sub: Subscription, wait: float, *, read: bool = True
) -> RunDetail:
    """The run once it finished, or as it stands after ``wait`` seconds. Woken by the commit
    notifier when a commit ends the run (in-process, and LISTEN/NOTIFY between replicas), not
    by polling nor by its steps' commits; a re-read every REREAD_S is the safety net for a
    lost notification. ``read``: read the run first (the subscription was taken after the
    caller's read); it is read first too when its end was heard already. Each read takes the
    run's children and key with it (``Store.run_detail``), so the answer needs no more."""
    deadline = time.monotonic() + wait
    detail = await owned_detail(store, run.id, key) if read or sub.finished else None
    while (
        not (detail.run if detail else run).finished and (left := deadline - time.monotonic()) > 0
    ):
        if sub.finished:  # heard of its end, yet read before it: never a busy loop
            await asyncio.sleep(min(left, SETTLE_S))
        else:
            await sub.until_finished(timeout=min(left, REREAD_S))
        detail = await owned_detail(store, run.id, key)
    return detail or await owned_detail(store, run.id, key)


@router.get("/{run_id}/events", response_model=EventPage)
async def events(
    run_id: str,
    request: Request,
    key: Annotated[ApiKey, Depends(scope("runs:read"))],
    after: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 1000,
    wait: Annotated[float, Query(ge=0, le=60)] = 0,
    expand: Literal["outputs"] | None = None,
) -> dict[str, Any]:
    """A page of the journal; with ``wait``, an empty page waits up to that many seconds for
    the next commit (woken by the commit notifier) before it answers. A finished run's journal
    is complete, so its empty page answers at once. ``expand=outputs`` puts each output stored
    apart (``outputRef``) beside its reference as ``output``."""
    s = services(request)
    store = s.store
    run = await owned_run(store, run_id, key)
    blobs = expand == "outputs"
    # one more than the page: is there a next?
    found = await store.events(run_id, after=after, limit=limit + 1, blobs=blobs)
    if wait and not found and not run.finished:
        with s.streams.hold(key.id):  # a long-poll holds a connection as a stream does
            found = await _next_events(store, run_id, after, limit, wait, blobs)
    page = found[:limit]
    return {
        "items": [event_json(e, expand=blobs) for e in page],
        "nextAfter": page[-1].seq if len(found) > limit else None,
    }


async def _next_events(
    store: Store, run_id: str, after: int, limit: int, wait: float, blobs: bool
) -> list[Event]:
    deadline = time.monotonic() + wait
    with store.notifier.subscribe(run_id) as sub:
        heard = max(sub.seq, after)
        found = await store.events(run_id, after=after, limit=limit + 1, blobs=blobs)
        while not found and (left := deadline - time.monotonic()) > 0:
            heard = await sub.wait(heard, timeout=min(left, REREAD_S))
            found = await store.events(run_id, after=after, limit=limit + 1, blobs=blobs)
    return found


@router.get("/{run_id}/deliveries", response_model=DeliveryList)
async def deliveries(
    run_id: str,
    request: Request,
    key: Annotated[ApiKey, Depends(scope("runs:read"))],
) -> dict[str, Any]:
    """The run's claimed deliveries; one claimed but never finished shows as unknown."""
    store = services(request).store
    await owned_run(store, run_id, key)
    return {"items": [delivery_json(d) for d in await store.deliveries(run_id)]}


@router.post("/{run_id}/cancel", status_code=202, response_model=RunOut)
async def cancel(
    run_id: str,
    request: Request,
    key: Annotated[ApiKey, Depends(scope("runs:execute"))],
) -> JSONResponse:
    s = services(request)
    await owned_run(s.store, run_id, key)
    run = await cancel_run(s.store, run_id, s.worker.worker_id, s.worker.keeper.ttl)
    return JSONResponse(run_json(run), status_code=202)


@router.post("/{run_id}/resume", status_code=202, response_model=RunOut)
async def resume(
    run_id: str,
    body: Resume,
    request: Request,
    key: Annotated[ApiKey, Depends(scope("runs:execute"))],
) -> JSONResponse:
    """Move a code-first run waiting for a version of its code onto ``version``: the
    operator's word that the new code replays the run's journal."""
    s = services(request)
    await owned_run(s.store, run_id, key)
    run = await resume_run(s.store, run_id, body.version, f"key:{key.id}", s.worker.keeper.ttl)
    s.worker.wake()
    return JSONResponse(run_json(run), status_code=202)


@router.post("/{run_id}/approvals/{node_id}", status_code=202, response_model=DecisionOut)
async def approve(
    run_id: str,
    node_id: str,
    body: Decision,
    request: Request,
    key: Annotated[ApiKey, Depends(scope("runs:approve"))],
) -> JSONResponse:
    """Approve or reject a run parked at an approval; decided once (a second one is 409)."""
    s = services(request)
    run = await owned_run(s.store, run_id, key)
    made = await decide(
        s.store,
        run,
        node_id,
        "approved" if body.decision == "approve" else "rejected",
        f"key:{key.id}",
        body.comment,
        decided_by_name=key.name,
    )
    s.worker.wake()  # the run is due: resume it here unless another replica is quicker
    return JSONResponse(
        {
            "runId": made.run_id,
            "nodeId": made.node_id,
            "decision": made.decision,
            "decidedBy": made.decided_by,
            "decidedByName": made.decided_by_name,
            "comment": made.comment,
        },
        status_code=202,
    )


@router.post("/{run_id}/signals/{name}", status_code=202, response_model=SignalOut)
async def signal(
    run_id: str,
    name: Annotated[str, Path(pattern=NAME.pattern)],
    body: SendSignal,
    request: Request,
    key: Annotated[ApiKey, Depends(scope("runs:execute"))],
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=255)] = None,
) -> JSONResponse:
    """Send the signal ``name`` to a run (docs/signals.md): stored durably before this
    answers, and taken by the run's first wait for that name (now or later); an
    ``Idempotency-Key`` makes a retried send one signal. 409 for a finished run."""
    s = services(request)
    run = await owned_run(s.store, run_id, key)
    sent = await send(s.store, run, name, body.payload, idempotency_key)
    s.worker.wake()  # a parked run is due now: resume it here unless another replica is quicker
    return JSONResponse({"id": sent.id, "name": sent.name, "runId": sent.run_id}, status_code=202)
