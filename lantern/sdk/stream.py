"""Following a run over ``GET /v1/runs/{id}/stream`` (Server-Sent Events), reconnecting.

``AsyncClient.stream(run_id)`` yields, in order:

- ``Event``: a journal event as it is committed (the same type ``events()`` returns);
- ``TextDelta``: a piece of a model step's answer as it is generated (never journaled);
- ``TextReset``: the step's text so far was a failed attempt's: drop it.

When the connection drops (a replica killed, a proxy timing out) it reconnects with
``Last-Event-ID`` set to the last journal event it yielded, so no event is missed or repeated;
it ends after the run's terminal event. ``LiveTexts`` applies the deltas and resets, so a
client shows each step's text once, however many reconnects and retries there were.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from lantern.sdk.errors import ConnectionFailed, InvalidResponse, error_from_body
from lantern.sdk.models import Event
from lantern.sdk.retry import Backoff

log = logging.getLogger("lantern.sdk")

TERMINAL_KINDS = frozenset({"run_succeeded", "run_failed", "run_cancelled"})


@dataclass(frozen=True)
class TextDelta:
    """``text`` goes at ``offset`` of the step attempt's text (see ``LiveTexts``)."""

    step_id: str
    attempt: int
    text: str
    offset: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TextDelta:
        return cls(
            str(data["stepId"]), int(data["attempt"]), str(data["text"]), int(data["offset"])
        )


@dataclass(frozen=True)
class TextReset:
    """The step's text so far belonged to attempt ``replaces``, which failed: ``attempt``'s
    text replaces it."""

    step_id: str
    attempt: int
    replaces: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TextReset:
        return cls(str(data["stepId"]), int(data["attempt"]), int(data["replaces"]))


StreamItem = Event | TextDelta | TextReset


class LiveTexts:
    """Each step's text as the stream builds it: feed it every item, read ``texts``."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}
        self._attempts: dict[str, int] = {}

    def apply(self, item: StreamItem) -> str | None:
        """Take in one item; the step whose text changed, if one did."""
        if isinstance(item, TextReset):
            if item.attempt >= self._attempts.get(item.step_id, 0):
                self._attempts[item.step_id] = item.attempt
                self.texts[item.step_id] = ""
                return item.step_id
            return None
        if isinstance(item, TextDelta):
            shown = self._attempts.get(item.step_id, 0)
            if item.attempt < shown:
                return None  # a late piece of a replaced attempt
            text = "" if item.attempt > shown else self.texts.get(item.step_id, "")
            self._attempts[item.step_id] = item.attempt
            self.texts[item.step_id] = text[: item.offset] + item.text
            return item.step_id
        if item.kind == "step_completed" and item.step_id is not None:
            output = item.data.get("output")
            # A model step's output (text, model, provider, usage): the journal's word is final,
            # and a follower on a replica that had no live text gets it here.
            if (
                isinstance(output, dict)
                and isinstance(output.get("text"), str)
                and "model" in output
            ):
                self.texts[item.step_id] = output["text"]
                return item.step_id
        return None


@dataclass(frozen=True)
class _Frame:
    event: str
    data: str
    id: str | None


async def _frames(lines: AsyncIterator[str]) -> AsyncIterator[_Frame]:
    """SSE frames from a body's lines (the WHATWG parsing rules Lantern's server needs)."""
    event, last_id = "message", None
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield _Frame(event, "\n".join(data), last_id)
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue  # a comment: the server's keep-alive ping
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            last_id = value


def _item(frame: _Frame) -> StreamItem | None:
    try:
        body = json.loads(frame.data)
        if frame.event == "journal":
            return Event.from_json(body)
        if frame.event == "delta":
            return TextDelta.from_json(body)
        if frame.event == "reset":
            return TextReset.from_json(body)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidResponse(f"unexpected {frame.event} frame from the server: {exc!r}") from exc
    return None  # a frame kind this client does not know: newer servers may send more


async def follow_stream(
    http: httpx.AsyncClient,
    run_id: str,
    path: str,
    *,
    after: int = 0,
    max_reconnects: int = 10,
    backoff: Backoff | None = None,
) -> AsyncIterator[StreamItem]:
    """The items of the run's stream after seq ``after``, across reconnects."""
    backoff = backoff or Backoff()
    failures = 0
    while True:
        headers = {"Accept": "text/event-stream"}
        if after:
            headers["Last-Event-ID"] = str(after)
        try:
            # No read timeout: the server pings an idle stream, a dead one is a closed socket.
            timeout = httpx.Timeout(http.timeout.connect, read=None)
            async with http.stream("GET", path, headers=headers, timeout=timeout) as response:
                if response.status_code == 204:
                    return  # the run had finished and we had seen its last event
                if not response.is_success:
                    raise error_from_body(response.status_code, (await response.aread()).decode())
                async for frame in _frames(response.aiter_lines()):
                    item = _item(frame)
                    if item is None:
                        continue
                    failures = 0
                    yield item
                    if isinstance(item, Event):
                        after = item.seq
                        if item.kind in TERMINAL_KINDS:
                            return
        except httpx.TransportError as exc:
            reason: str = f"{type(exc).__name__}: {exc}"
        else:
            reason = "the stream ended before the run did"
        if failures >= max_reconnects:
            raise ConnectionFailed(
                f"GET {path}: {reason} (after {failures + 1} attempts to follow run {run_id})"
            )
        delay = backoff.delay(failures)
        failures += 1
        log.info("following run %s again after seq %d in %.2fs: %s", run_id, after, delay, reason)
        await asyncio.sleep(delay)


def texts_of(items: Iterable[StreamItem]) -> dict[str, str]:
    """The step texts a whole stream builds (a convenience for tests and scripts)."""
    live = LiveTexts()
    for item in items:
        live.apply(item)
    return live.texts
