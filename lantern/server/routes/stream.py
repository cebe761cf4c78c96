"""GET /v1/runs/{id}/stream: a run's journal as it is committed, and its live model text, as
Server-Sent Events.

Frames:

- ``event: journal``, ``id: <seq>``: one journal event, as ``GET /v1/runs/{id}/events`` shows it.
- ``event: delta``: ``{stepId, attempt, text, offset}``, a piece of a model step's answer as it
  is generated (never journaled). ``offset`` is where ``text`` starts in that attempt's text:
  apply ``text = text[:offset] + piece`` and nothing shows twice, even across reconnects.
- ``event: reset``: ``{stepId, attempt, replaces}``, the step's text so far belonged to a
  failed attempt: drop it; the new attempt's deltas follow.

Reconnecting with ``Last-Event-ID: <seq>`` (browsers send it by themselves) resumes after that
seq; ``?after=SEQ`` does the same for clients that cannot set headers. The stream ends after the
run's terminal event; asking again once that was seen answers 204, which tells an EventSource
to stop reconnecting.

The journal comes from the database, woken by the commit notifier (LISTEN/NOTIFY between
PostgreSQL replicas), so a follower on any replica sees every event. Live text exists only on
the replica driving the run: a follower on another replica gets the journal and each step's
final text in its ``step_completed``, but no deltas.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from lantern.engine import events as ev
from lantern.engine.live import LiveText
from lantern.server.deps import owned_run, scope, services
from lantern.server.schemas import PROBLEMS
from lantern.server.tails import Tails
from lantern.store.base import Store
from lantern.store.records import ApiKey

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=PROBLEMS)

# The safety net under the notifier: a follower re-reads the journal at least this often,
# so a notification lost to a crash or to a dropped connection costs at most this much.
REREAD_S = 2.0
PING_S = 15.0  # a comment line this often keeps proxies from closing an idle stream


@router.get(
    "/{run_id}/stream",
    response_class=Response,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "the run's events"},
        204: {"description": "the run has finished and the client saw its last event"},
    },
)
async def stream(
    run_id: str,
    request: Request,
    key: Annotated[ApiKey, Depends(scope("runs:read"))],
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", max_length=20, pattern=r"^\d+$")
    ] = None,
    after: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
) -> Response:
    s = services(request)
    run = await owned_run(s.store, run_id, key)
    seen = int(last_event_id) if last_event_id is not None else (after or 0)
    if run.finished:
        count, _ = await s.store.journal_head(run_id)
        if seen >= count:
            return Response(status_code=204)
    release = s.streams.take(key.id)  # given back when the stream ends, however it ends
    return EventSourceResponse(
        _holding(frames(s.store, s.worker.live, run_id, seen), release),
        ping=PING_S,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _holding(
    source: AsyncIterator[ServerSentEvent], release: Callable[[], None]
) -> AsyncIterator[ServerSentEvent]:
    """``source``'s frames, the key's stream slot held until the stream ends or is dropped."""
    try:
        async for frame in source:
            yield frame
    finally:
        release()


async def frames(
    store: Store, live: LiveText, run_id: str, seen: int
) -> AsyncIterator[ServerSentEvent]:
    """The run's frames after ``seen`` until its terminal event."""
    with (
        store.notifier.subscribe(run_id) as sub,
        live.follow(run_id, sub.poke) as follower,
        _tails(store).follow(run_id) as tail,
    ):
        shown: dict[str, int] = {}  # step -> the attempt whose text the client shows
        settled: set[tuple[str, int]] = set()  # step attempts whose outcome was sent
        known, reread = seen, True  # the newest seq the notifier told of; read afresh?
        loop = asyncio.get_running_loop()
        while True:
            for e, encoded in await tail.since(seen, known, reread=reread):
                yield ServerSentEvent(data=encoded, event="journal", id=str(e.seq))
                seen = e.seq
                if e.kind in ev.TERMINAL_KINDS:
                    return
                if e.step_id is None or e.attempt is None:
                    continue
                if e.kind in (ev.STEP_COMPLETED, ev.STEP_FAILED):
                    settled.add((e.step_id, e.attempt))
                elif e.kind == ev.STEP_RETRYING and shown.get(e.step_id, e.attempt) < e.attempt:
                    yield _reset(e.step_id, e.attempt, shown[e.step_id])
                    shown[e.step_id] = e.attempt
            for d in follower.take():
                if (d.step_id, d.attempt) in settled:
                    continue  # its final text is in the journal already
                before = shown.get(d.step_id)
                if before is not None and before < d.attempt:
                    yield _reset(d.step_id, d.attempt, before)
                shown[d.step_id] = d.attempt
                yield ServerSentEvent(data=json.dumps(d.to_json()), event="delta")
            began = loop.time()
            known = await sub.wait(seen, timeout=REREAD_S)
            # Woken by live text: no journal read. Nothing heard for REREAD_S: read anyway.
            stale, sub.stale = sub.stale, False  # the notifier may have missed commits
            reread = stale or (known <= seen and loop.time() - began >= REREAD_S)


_TAILS: weakref.WeakKeyDictionary[Store, Tails] = weakref.WeakKeyDictionary()


def _tails(store: Store) -> Tails:
    """The followed runs' shared journal tails of this store (one per process)."""
    found = _TAILS.get(store)
    if found is None:
        found = _TAILS[store] = Tails(store)
    return found


def _reset(step_id: str, attempt: int, replaces: int) -> ServerSentEvent:
    body = {"stepId": step_id, "attempt": attempt, "replaces": replaces}
    return ServerSentEvent(data=json.dumps(body), event="reset")
