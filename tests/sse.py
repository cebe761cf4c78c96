"""Reading a run's Server-Sent Events stream with a plain HTTP client (httpx), as any
non-Lantern client would: frames parsed from the body by the SSE rules, nothing more."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Frame:
    event: str
    data: Any
    id: str | None

    @property
    def seq(self) -> int:
        assert self.event == "journal"
        return int(self.data["seq"])


async def frames(
    http: httpx.AsyncClient, run_id: str, *, last_event_id: int | None = None
) -> AsyncIterator[Frame]:
    """The stream's frames until the server ends it; an unexpected status raises."""
    headers = {"Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    timeout = httpx.Timeout(30, read=60)
    async with http.stream(
        "GET", f"/v1/runs/{run_id}/stream", headers=headers, timeout=timeout
    ) as response:
        if response.status_code != 200:
            await response.aread()
            raise AssertionError(f"stream answered {response.status_code}: {response.text}")
        assert response.headers["content-type"].startswith("text/event-stream")
        event, last = "message", None
        data: list[str] = []
        async for line in response.aiter_lines():
            if not line:
                if data:
                    yield Frame(event, json.loads("\n".join(data)), last)
                event, data, last = "message", [], None
            elif line.startswith(":"):
                continue
            else:
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "event":
                    event = value
                elif name == "data":
                    data.append(value)
                elif name == "id":
                    last = value


async def collect(
    http: httpx.AsyncClient, run_id: str, *, last_event_id: int | None = None
) -> list[Frame]:
    return [f async for f in frames(http, run_id, last_event_id=last_event_id)]


def journal(got: list[Frame]) -> list[Frame]:
    return [f for f in got if f.event == "journal"]
