"""``AsyncClient.stream`` and ``Client.stream`` against a real `lantern serve`: typed items,
live text assembled by ``LiveTexts``, and a reconnect with Last-Event-ID after the server
was SIGKILLed and started again on the same port, missing nothing and repeating nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import lantern
from lantern.sdk.stream import StreamItem
from tests.api.test_stream import approve, client_for, gated_model, start
from tests.server import ALL_SCOPES, Server, make_key


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_the_client_follows_across_a_server_restart_and_assembles_live_text(
    database_url: str, tmp_path: Path
) -> None:
    env = {"LANTERN_OFFLINE_WORD_DELAY": "20ms", "LANTERN_WORKER_ID": "one"}
    server = Server(database_url, tmp_path / "serve.log", env=env).start()
    key = await asyncio.to_thread(make_key, database_url, "default", ALL_SCOPES)
    http = await client_for(server, "default")
    text = "the lamp is lit and the night is long"
    items: list[StreamItem] = []
    parked = asyncio.Event()
    try:
        run_id = await start(http, gated_model("sdk", "offline/echo"), {"text": text})
        async with lantern.AsyncClient(server.url, key) as client:

            async def follow() -> None:
                async for item in client.stream(run_id):
                    items.append(item)
                    if isinstance(item, lantern.Event) and item.kind == "step_waiting":
                        parked.set()

            following = asyncio.ensure_future(follow())
            await asyncio.wait_for(parked.wait(), 60)
            server.kill()  # the follower's connection drops mid-run
            server = Server(database_url, server.log, env=env, port=server.port).start()
            await approve(http, run_id)
            await asyncio.wait_for(following, 120)

        def blocking_follow() -> list[StreamItem]:
            with lantern.Client(server.url, key) as blocking:
                return list(blocking.stream(run_id))

        again = await asyncio.to_thread(blocking_follow)
    finally:
        await http.aclose()
        server.stop()
    events = [i for i in items if isinstance(i, lantern.Event)]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # none missed or twice
    assert events[-1].kind == "run_succeeded"
    live = lantern.LiveTexts()
    for item in items:
        live.apply(item)
    assert live.texts["draft"] == text
    # The blocking client yields the same journal for the finished run, then stops.
    assert [e.seq for e in again if isinstance(e, lantern.Event)] == [e.seq for e in events]
