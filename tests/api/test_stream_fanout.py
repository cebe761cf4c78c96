"""200 followers of one run, each on its own HTTP connection: every one gets every event."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.api.test_stream import approve, chain, client_for, journal_of, start
from tests.server import Server
from tests.sse import Frame, frames, journal

FOLLOWERS = 200


def gated_chain(name: str, steps: int) -> dict[str, Any]:
    definition = chain(name, steps)
    graph = definition["graph"]
    graph["nodes"].insert(1, {"id": "ok", "type": "approval", "data": {"prompt": "Go?"}})
    graph["edges"][0] = {"source": "start", "target": "ok"}
    graph["edges"].insert(1, {"source": "ok", "target": "s1"})
    return definition


@pytest.fixture
def wide_server(database_url: str, tmp_path: Path) -> Iterator[Server]:
    """A server whose keys may each hold every follower (LANTERN_STREAMS_PER_KEY)."""
    env = {"LANTERN_STREAMS_PER_KEY": str(FOLLOWERS)}
    server = Server(database_url, tmp_path / "serve.log", env=env).start()
    yield server
    server.stop()


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_two_hundred_followers_each_get_every_event(wide_server: Server) -> None:
    http = await client_for(wide_server)
    try:
        run_id = await start(http, gated_chain("wide", 5), {})
        parked = [asyncio.Event() for _ in range(FOLLOWERS)]
        got: list[list[Frame]] = [[] for _ in range(FOLLOWERS)]

        async def follow(i: int) -> None:
            async for frame in frames(http, run_id):
                got[i].append(frame)
                if frame.data.get("kind") == "step_waiting":
                    parked[i].set()

        followers = [asyncio.ensure_future(follow(i)) for i in range(FOLLOWERS)]
        # Everyone is connected and has caught up before the run goes on.
        await asyncio.wait_for(asyncio.gather(*(p.wait() for p in parked)), 120)
        await approve(http, run_id)
        await asyncio.wait_for(asyncio.gather(*followers), 120)
        stored = [e["seq"] for e in await journal_of(http, run_id)]
    finally:
        await http.aclose()
    assert stored[-1] > 10
    for frames_of_one in got:
        assert [f.seq for f in journal(frames_of_one)] == stored
