"""A follower of a run whose replica is SIGKILLed mid-run: it reconnects, with Last-Event-ID,
to the process that recovers the run, and gets every event exactly once. On PostgreSQL a
second follower on the standby replica (which never drove the run) sees it all live too."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from lantern.demo.receiver import Receiver
from lantern.engine.runs import apply_agent, create_run
from lantern.store import Store
from tests.helpers import http_chain
from tests.server import ALL_SCOPES, Server, make_key
from tests.sse import Frame, frames, journal

FAST = {"LANTERN_LEASE_TTL": "2s", "LANTERN_RECOVERY_INTERVAL": "250ms"}


def replica(store: Store, tmp_path: Path, name: str) -> Server:
    env = {**FAST, "LANTERN_WORKER_ID": name}
    return Server(store.url, tmp_path / f"{name}.log", env=env).start()


def client(server: Server, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {key}"})


async def follow_until_cut(http: httpx.AsyncClient, run_id: str, got: list[Frame]) -> None:
    """Follow until the server goes away (the SIGKILL) or the run ends."""
    try:
        async for frame in frames(http, run_id):
            got.append(frame)
    except httpx.TransportError:
        pass


async def test_a_follower_reconnects_to_the_recovering_process_and_misses_nothing(
    store: Store, receiver: Receiver, tmp_path: Path
) -> None:
    await apply_agent(store, http_chain("chain", receiver.url, 4))
    key = await asyncio.to_thread(make_key, store.url, "default", ALL_SCOPES)
    receiver.hold("/s2")
    first = replica(store, tmp_path, "r1")
    shared = store.url.startswith("postgres")
    standby = replica(store, tmp_path, "r2") if shared else None
    run = await create_run(store, "chain", {})
    on_first, on_standby = client(first, key), client(standby or first, key)
    cut: list[Frame] = []
    watching: list[Frame] = []
    try:
        following = asyncio.ensure_future(follow_until_cut(on_first, run.id, cut))
        across = asyncio.ensure_future(follow_until_cut(on_standby, run.id, watching))
        await asyncio.to_thread(receiver.arrived.wait, 30)  # s2 in flight on r1
        await asyncio.sleep(0.3)  # r1's stream has sent what was committed
        first.kill()
        await asyncio.wait_for(following, 30)
        receiver.release()
        if standby is None:  # SQLite: the next process on the file recovers the run
            standby = replica(store, tmp_path, "r2")
        seen = journal(cut)[-1].seq
        again = client(standby, key)
        try:
            rest = [f async for f in frames(again, run.id, last_event_id=seen)]
        finally:
            await again.aclose()
        if shared:
            await asyncio.wait_for(across, 30)
        else:
            across.cancel()
    finally:
        await on_first.aclose()
        await on_standby.aclose()
        if standby is not None:
            standby.stop()
    stored = await store.events(run.id)
    seqs = [f.seq for f in journal(cut)] + [f.seq for f in journal(rest)]
    assert seqs == [e.seq for e in stored]  # every event once, in order, across the cut
    kinds = [f.data["kind"] for f in journal(cut) + journal(rest)]
    assert "step_started" in kinds[: len(journal(cut))]
    assert "run_recovered" in kinds and kinds[-1] == "run_succeeded"
    if shared:
        # The follower on the replica that never drove until the kill saw everything live.
        assert [f.seq for f in journal(watching)] == [e.seq for e in stored]
