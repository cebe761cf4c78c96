"""The commit notifier: every journal commit wakes the run's waiters, on both backends, and
(PostgreSQL) on the other replicas too."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

from lantern.engine.journal import EventWriter
from lantern.store import Append, RunUpdate, Store, open_store
from lantern.store.notify import Notifier
from lantern.store.postgres import notify as pg_notify
from tests.conformance.helpers import new_run
from tests.crash.test_sigkill import wait_for


async def _started(store: Store) -> tuple[str, EventWriter, object]:
    run = await new_run(store)
    w = EventWriter(run.id)
    lease = await store.start_run(
        run.id, "w1", 60, [w.event("run_started", {})], RunUpdate("running")
    )
    assert lease is not None
    return run.id, w, lease


async def test_a_commit_wakes_the_runs_subscribers_with_its_seq(store: Store) -> None:
    run = await new_run(store)
    w = EventWriter(run.id)
    with store.notifier.subscribe(run.id) as sub, store.notifier.subscribe(run.id) as other:
        # (On PostgreSQL the first subscription also starts the listener, whose coming up
        # pokes every waiter once: ``past`` waits again after such a poke.)
        waiting = asyncio.ensure_future(past(sub, 0))
        await asyncio.sleep(0)
        lease = await store.start_run(
            run.id, "w1", 60, [w.event("run_started", {})], RunUpdate("running")
        )
        assert lease is not None
        assert await waiting == 1
        await store.append(Append(lease, (w.event("step_started", {}, step_id="a"),), None))
        await store.append(Append(lease, (w.event("step_completed", {}, step_id="a"),), None))
        assert await past(sub, 1) == 3
        assert await past(other, 0) == 3
        assert store.notifier.subscribers(run.id) == 2
    assert store.notifier.subscribers(run.id) == 0


async def test_a_commit_between_the_read_and_the_wait_is_not_missed(store: Store) -> None:
    run_id, w, lease = await _started(store)
    with store.notifier.subscribe(run_id) as sub:
        seen = (await store.events(run_id))[-1].seq
        # Commits land after the read, before anyone waits.
        await store.append(Append(lease, (w.event("step_started", {}, step_id="a"),), None))  # type: ignore[arg-type]
        began = time.monotonic()
        assert await sub.wait(seen, timeout=30) == 2
        assert time.monotonic() - began < 1
    # A wait with nothing new returns at its timeout, having heard of nothing past `after`.
    assert await store.notifier.wait(run_id, 2, timeout=0.05) == 2


async def test_a_status_only_update_notifies_nobody_and_a_refused_write_neither(
    store: Store,
) -> None:
    run_id, w, lease = await _started(store)
    with store.notifier.subscribe(run_id) as sub:
        await store.append(Append(lease, (), RunUpdate("running")))  # type: ignore[arg-type]
        assert await sub.wait(1, timeout=0.1) == 1
        stolen = await store.acquire_lease(run_id, "w1", 60)  # a new epoch fences the old
        assert stolen is not None
        with pytest.raises(Exception, match="lease"):
            await store.append(Append(lease, (w.event("step_started", {}, step_id="a"),), None))  # type: ignore[arg-type]
        assert await sub.wait(1, timeout=0.1) == 1


async def past(sub: Any, after: int, timeout: float = 10) -> int:
    """Wait as a follower does: a poke (the listener coming up) ends a wait early, so wait
    again until the journal is past ``after`` or the time is up."""
    deadline = time.monotonic() + timeout
    while sub.seq <= after and time.monotonic() < deadline:
        await sub.wait(after, timeout=deadline - time.monotonic())
    return int(sub.seq)


async def listening(store: Store) -> None:
    """A replica listens to its peers once something in it subscribes."""
    await asyncio.wait_for(store._relay.listening.wait(), 10)  # type: ignore[attr-defined]


async def test_a_replica_that_follows_nothing_holds_no_listening_connection(pg_url: str) -> None:
    a = open_store(pg_url)
    await a.open()
    try:
        await _started(a)
        assert a._relay._listener is None  # type: ignore[attr-defined]
        with a.notifier.subscribe("run_x"):
            await listening(a)
    finally:
        await a.close()


async def test_postgres_replicas_hear_each_others_commits(pg_url: str) -> None:
    a, b = open_store(pg_url), open_store(pg_url)
    await a.open()
    await b.open()
    try:
        run_id, w, lease = await _started(a)
        with b.notifier.subscribe(run_id) as sub:
            await listening(b)
            await a.append(Append(lease, (w.event("step_started", {}, step_id="x"),), None))  # type: ignore[arg-type]
            assert await past(sub, 1) == 2
            # Many commits in a burst arrive coalesced, ending at the newest seq.
            for i in range(50):
                await a.append(Append(lease, (w.event("note", {"i": i}),), None))  # type: ignore[arg-type]
            deadline = time.monotonic() + 10
            while sub.seq < 52 and time.monotonic() < deadline:
                await sub.wait(sub.seq, timeout=1)
            assert sub.seq == 52
    finally:
        await a.close()
        await b.close()


async def test_a_dropped_listener_reconnects_and_wakes_waiters_to_reread(pg_url: str) -> None:
    a, b = open_store(pg_url), open_store(pg_url)
    await a.open()
    await b.open()
    try:
        run_id, w, lease = await _started(a)
        with b.notifier.subscribe(run_id) as sub:
            await listening(b)
            await sub.wait(1, timeout=0.5)  # the poke of the listener coming up
            sub.stale = False
            waiting = asyncio.ensure_future(sub.wait(1, timeout=30))
            await asyncio.sleep(0.05)
            channel = b._relay.channel  # type: ignore[attr-defined]
            with psycopg.connect(pg_url, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE query = %s AND pid <> pg_backend_pid()",
                    (f'LISTEN "{channel}"',),
                )
            began = time.monotonic()
            await waiting
            assert sub.stale  # woken by the resync: re-read, commits may have been missed
            assert time.monotonic() - began < 10
            # Listening again: the next commit of the peer is heard.
            await asyncio.sleep(0.2)
            await a.append(Append(lease, (w.event("step_started", {}, step_id="x"),), None))  # type: ignore[arg-type]
            assert await past(sub, 1) == 2
    finally:
        await a.close()
        await b.close()


async def test_a_notifier_remembers_recent_runs_within_a_bound() -> None:
    n = Notifier()
    n.committed("r1", 4)
    assert n.latest("r1") == 4
    with n.subscribe("r1") as sub:
        assert await sub.wait(3, timeout=0) == 4  # known before subscribing
    n.advanced("r1", 2)  # an older, late notification never moves it back
    assert n.latest("r1") == 4
    for i in range(10_001):
        n.advanced(f"x{i}", 1)
    assert n.latest("r1") == 0


async def test_a_waiter_for_the_end_sleeps_through_step_commits(store: Store) -> None:
    """GET /v1/runs/{id}?wait reads the run once, at its end, not at each step's commit."""
    run_id, w, lease = await _started(store)
    with store.notifier.subscribe(run_id) as sub:
        await sub.until_finished(timeout=0.5)  # (PostgreSQL: the listener coming up pokes)
        for step in ("a", "b"):
            await store.append(Append(lease, (w.event("step_started", {}, step_id=step),), None))  # type: ignore[arg-type]
            assert not await sub.until_finished(timeout=0.05)
        ending = asyncio.ensure_future(sub.until_finished(timeout=30))
        await asyncio.sleep(0)
        began = time.monotonic()
        await store.append(
            Append(lease, (w.event("run_succeeded", {}),), RunUpdate("succeeded"))  # type: ignore[arg-type]
        )
        assert await ending and time.monotonic() - began < 1
    with store.notifier.subscribe(run_id) as late:  # its end is remembered for a while
        assert late.finished


async def test_a_replica_hears_the_commit_that_ends_a_run_on_another(pg_url: str) -> None:
    a, b = open_store(pg_url), open_store(pg_url)
    await a.open()
    await b.open()
    try:
        run_id, w, lease = await _started(a)
        with b.notifier.subscribe(run_id) as sub:
            await listening(b)
            await a.append(Append(lease, (w.event("step_started", {}, step_id="x"),), None))  # type: ignore[arg-type]
            assert await past(sub, 1) == 2 and not sub.finished
            await a.append(
                Append(lease, (w.event("run_succeeded", {}),), RunUpdate("succeeded"))  # type: ignore[arg-type]
            )
            deadline = time.monotonic() + 10
            while not sub.finished and time.monotonic() < deadline:
                await sub.until_finished(timeout=1)
            assert sub.finished and sub.seq == 3
    finally:
        await a.close()
        await b.close()


def notifies_sent(store: Store) -> list[str]:
    """The NOTIFY statements the store's relay sends from now on, as they are sent."""
    sent: list[str] = []
    relay: Any = store._relay  # type: ignore[attr-defined]
    execute = relay._execute

    async def counted(sql: str, args: Any) -> Any:
        if "pg_notify" in sql:
            sent.append(sql)
        return await execute(sql, args)

    relay._execute = counted
    return sent


async def test_a_replica_no_peer_listens_to_sends_no_notify(pg_url: str) -> None:
    """A lone replica pays no NOTIFY round trip per commit; one that starts listening hears
    the commits made from then on (and re-reads what came before: its resync)."""
    a = open_store(pg_url)
    await a.open()
    sent = notifies_sent(a)
    try:
        run_id, w, lease = await _started(a)
        for i in range(20):
            await a.append(Append(lease, (w.event("note", {"i": i}),), None))  # type: ignore[arg-type]
        await asyncio.sleep(1.2)  # past two looks for listeners
        assert sent == []
        b = open_store(pg_url)
        await b.open()
        try:
            with b.notifier.subscribe(run_id) as sub:
                await listening(b)
                await a.append(Append(lease, (w.event("note", {}),), None))  # type: ignore[arg-type]
                assert await past(sub, 21) == 22
            assert sent
        finally:
            await b.close()
    finally:
        await a.close()


async def test_a_replica_listens_only_while_a_run_it_follows_is_driven_elsewhere(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers that each follow the runs they drive (a create with ``?wait``) make their peers
    send no NOTIFY; a followed run driven elsewhere has its peer's commits heard again."""
    monkeypatch.setattr(pg_notify, "LINGER_S", 0.5)
    a, b = open_store(pg_url), open_store(pg_url)
    await a.open()
    await b.open()
    sent = notifies_sent(a)
    try:
        run_id, w, lease = await _started(a)
        here = {run_id}
        b.notifier.driven_here = here.__contains__  # as b's worker says of the runs it drives
        with b.notifier.subscribe(run_id) as sub:
            for i in range(5):
                await a.append(Append(lease, (w.event("note", {"i": i}),), None))  # type: ignore[arg-type]
                await asyncio.sleep(0.3)  # across several of a's looks for listeners
            assert sent == [] and not b._relay.listening.is_set()  # type: ignore[attr-defined]
            here.clear()  # the run is driven elsewhere (by a): b needs a's commits
            await listening(b)
            await a.append(Append(lease, (w.event("note", {}),), None))  # type: ignore[arg-type]
            assert await past(sub, 6) == 7
            assert sent
        # Nothing followed elsewhere any more: it stops listening, after its linger.
        await wait_for(lambda: not b._relay.listening.is_set(), timeout=10)  # type: ignore[attr-defined]
    finally:
        await a.close()
        await b.close()
