"""Rate limits on model calls, in the one path every kind of run's model step takes (graph
ai-step, plain agent turn, code-first ``ctx.model``), on both backends, against the fake
provider: a throttled step waits (journaled ``step_throttled``) and then runs, a call larger
than the limit fails at once naming it, a provider's 429 is retried after its Retry-After.

The window another replica filled is written through the store, as that replica would have,
so a wait here is seconds, not the minute a real limit takes (tests/integration/
test_rate_limits_fleet.py runs the minute across two replicas)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import lantern
from lantern.engine.runs import create_run
from lantern.engine.worker import Worker
from lantern.models.limit_spec import parse_limit
from lantern.models.throttle import SLOT_MS, SLOTS, slot_of
from lantern.store import Store, open_store
from lantern.store.model_limits import SERVER, Slot
from lantern.store.records import Run
from tests.fake_llm import FakeProvider, Script
from tests.integration.test_cli_usage import in_process

MODEL = "gpt-4o-mini"
KINDS = ("graph", "plain", "code")
STEP = {"graph": "draft", "plain": "llm:1", "code": "draft"}

GRAPH = {
    "name": "graph",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {
                "id": "draft",
                "type": "ai-step",
                "data": {"model": MODEL, "prompt": "Say hi to {{ input.who }}", "maxTokens": 30},
            },
        ],
        "edges": [{"source": "start", "target": "draft"}],
    },
}
PLAIN = {"name": "plain", "model": MODEL, "system": "Be brief.", "maxTokens": 30}


def make_app() -> lantern.App:
    app = lantern.App()

    @app.agent("code")
    async def code(ctx: lantern.Context, who: str) -> str:
        reply = await ctx.model(MODEL, prompt=f"Say hi to {who}", name="draft", max_tokens=30)
        return reply.text

    @app.agent("chores")
    async def chores(ctx: lantern.Context) -> str:
        return str(await ctx.step("sweep", lambda: "swept"))

    return app


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProvider]:
    provider = FakeProvider(script=Script(["Hi."])).start()
    for name, value in provider.env().items():
        monkeypatch.setenv(name, value)
    yield provider
    provider.close()


async def run_one(
    store: Store, kind: str, beside: Callable[[str], Awaitable[None]] | None = None
) -> Any:
    """Serve one run of ``kind`` to its end (``beside(run_id)`` running meanwhile)."""
    app = make_app()
    await store.put_agent("default", "graph", GRAPH)
    await store.put_agent("default", "plain", PLAIN)
    body: Any = "Say hi to Ada" if kind == "plain" else {"who": "Ada"}
    run = await create_run(store, kind, body, app=app)
    other = None if beside is None else asyncio.ensure_future(beside(run.id))
    try:
        async with serving(store, app):
            return await finished(store, run.id)
    finally:
        if other is not None:
            other.cancel()


@contextlib.asynccontextmanager
async def serving(store: Store, app: lantern.App, slots: int = 256) -> AsyncIterator[Worker]:
    """A worker serving (claiming queued and due parked runs) with ``slots`` run slots."""
    async with Worker(
        store, app, worker_id="w1", lease_ttl=60, max_concurrent=slots, poll_interval=0.05
    ) as w:
        task = asyncio.create_task(w.serve())
        try:
            yield w
        finally:
            await w.stop(grace=1)
            await task


async def until(store: Store, run_id: str, *statuses: str, timeout: float = 30) -> Run:
    """The run once its status is one of ``statuses`` (none given: once it has finished)."""
    async with asyncio.timeout(timeout):
        while True:
            run = await store.get_run(run_id)
            assert run is not None
            if run.status in statuses or (not statuses and run.finished):
                return run
            await asyncio.sleep(0.02)


async def finished(store: Store, run_id: str) -> Run:
    return await until(store, run_id)


async def journal(store: Store, run_id: str) -> list[tuple[str, Any, Any]]:
    return [(e.kind, e.step_id, e.data) for e in await store.events(run_id)]


async def fill(store: Store, name: str, tokens: int, leaves_in_s: float, requests: int = 1) -> None:
    """Spend ``tokens`` and ``requests`` of the limit in a slot that leaves its window in
    ``leaves_in_s``, as another replica's calls would have."""
    limit = await store.get_limit("default", name)
    assert limit is not None
    gone = slot_of(int((time.time() + leaves_in_s) * 1000))
    assert await store.swap_window(limit, (Slot(gone - SLOTS, tokens, requests),))


async def keep_full(
    store: Store, name: str, run_id: str, tokens: int = 95, requests: int = 1
) -> None:
    """Keep the limit full, as another replica's calls would, until the run is throttled."""
    while not any(e.kind == "step_throttled" for e in await store.events(run_id)):
        await fill(store, name, tokens, leaves_in_s=1.5, requests=requests)
        await asyncio.sleep(0.2)


async def fill_window(database_url: str, name: str, tokens: int, leaves_in_s: float) -> None:
    """``fill`` in the database of a server a test started."""
    store = open_store(database_url)
    await store.open()
    try:
        await fill(store, name, tokens, leaves_in_s)
    finally:
        await store.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_throttled_model_step_waits_parked_then_runs(
    store: Store, fake: FakeProvider, kind: str
) -> None:
    """With one run slot, a run with no model call runs to its end while the throttled run
    waits: the wait holds no slot (and no lease); the throttled run is claimed again when due."""
    await store.put_limit("default", "tpm", "openai/*", 100, None)
    await fill(store, "tpm", 95, leaves_in_s=1.5)  # full before the step can reserve
    app = make_app()
    await store.put_agent("default", "graph", GRAPH)
    await store.put_agent("default", "plain", PLAIN)
    body: Any = "Say hi to Ada" if kind == "plain" else {"who": "Ada"}
    run = await create_run(store, kind, body, app=app)
    async with serving(store, app, slots=1):
        await keep_full(store, "tpm", run.id)
        await until(store, run.id, "waiting")
        assert await store.runs_leased_by("w1") == []  # parked: no lease, no slot
        chores = await create_run(store, "chores", None, app=app)
        other = await finished(store, chores.id)
        done = await finished(store, run.id)
    assert other.status == "succeeded", other.error
    assert done.status == "succeeded", done.error
    events = await journal(store, done.id)
    throttled = [(s, d) for k, s, d in events if k == "step_throttled"]
    assert throttled and throttled[0][0] == STEP[kind]
    assert throttled[0][1]["limit"] == "tpm" and 0 < throttled[0][1]["waitMs"] <= 3 * SLOT_MS
    # It waited for the room: the call came no sooner than the journaled due time.
    started = [e for e in await store.events(done.id) if e.kind == "step_started"][-1]
    assert started.at.timestamp() * 1000 >= throttled[-1][1]["dueAt"] - 5
    # The other run, started once the throttled one parked, ended before its call was made:
    # one slot, so the throttled run did not hold it while it waited.
    ended = next(e for e in await store.events(chores.id) if e.kind == "run_succeeded")
    assert ended.at <= started.at
    assert "run_resumed" in [k for k, _, _ in events]  # woken from its park
    # No call was made while it waited, and the wait spent no attempt: one call, attempt 1.
    assert len(fake.calls()) == 1
    starts = [e for e in await store.events(done.id) if e.kind == "step_started"]
    assert {e.attempt for e in starts if e.step_id == STEP[kind]} == {1}
    assert not any(k == "step_retrying" for k, _, _ in events)
    # Settled to the provider's usage: the window holds what the call used.
    limit = await store.get_limit("default", "tpm")
    assert limit is not None
    used = done.usage.input_tokens + done.usage.output_tokens
    assert used in {s.tokens for s in limit.window}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_call_larger_than_the_limit_fails_at_once_naming_it(
    store: Store, fake: FakeProvider, kind: str
) -> None:
    await store.put_limit(SERVER, "tiny", "openai/gpt-*", 20, None)
    started = time.monotonic()
    done = await run_one(store, kind)
    assert time.monotonic() - started < 20
    assert done.status == "failed"
    assert "'tiny'" in done.error["message"] and "tokensPerMinute 20" in done.error["message"]
    assert fake.calls() == []  # never sent
    assert not any(k == "step_retrying" for k, _, _ in await journal(store, done.id))


@pytest.mark.parametrize("kind", KINDS)
async def test_a_429_is_retried_after_its_retry_after(
    store: Store, fake: FakeProvider, kind: str
) -> None:
    fake.fail(MODEL, 429, retry_after="1")  # past the model policy's 250-500 ms backoff
    done = await run_one(store, kind)
    assert done.status == "succeeded", done.error
    retrying = [d for k, _, d in await journal(store, done.id) if k == "step_retrying"]
    assert len(retrying) == 1 and retrying[0]["delayMs"] >= 1000
    assert "429" in retrying[0]["error"]["message"] and retrying[0]["error"]["class"] == "llm"
    calls = fake.calls()
    assert len(calls) == 2 and calls[0].key != calls[1].key  # each attempt its own key


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rate-limits"


def shipped(name: str) -> Any:
    return json.loads((EXAMPLE / name).read_text())


async def test_the_example_holds_offline_calls_to_three_a_minute(store: Store) -> None:
    """examples/rate-limits/ as shipped: its limit holds the offline model's calls."""
    spec = parse_limit(shipped("offline-limit.json"))
    assert parse_limit(shipped("openai-fleet.json")).server
    await store.put_limit("default", "offline-rpm", spec.model, spec.tokens_per_minute, 3)
    await store.put_agent("default", "summarise", shipped("summarise.json"))
    await fill(store, "offline-rpm", 0, leaves_in_s=1.5, requests=3)  # three calls this minute
    app = lantern.App()
    run = await create_run(store, "summarise", {"text": "note 4"}, app=app)
    async with serving(store, app):
        await keep_full(store, "offline-rpm", run.id, tokens=0, requests=3)
        done = await finished(store, run.id)
    assert done.status == "succeeded", done
    throttled = [e.data for e in await store.events(run.id) if e.kind == "step_throttled"]
    assert throttled and throttled[0]["limit"] == "offline-rpm"


def test_lantern_run_wait_with_no_server_waits_out_a_throttled_step(
    database_url: str, fake: FakeProvider
) -> None:
    """`lantern run --wait` executes the run in its own process, where no dispatcher claims a
    parked run when due: the CLI waits for a rate limit's due time and goes on, so it prints
    the run succeeded. (The park itself is the drives', tested above for every kind; this is
    the CLI's loop around it, the same for every kind.)"""

    async def prepare() -> None:
        store = open_store(database_url)
        await store.open()
        try:
            await store.put_limit("default", "tpm", "openai/*", 100, None)
            await fill(store, "tpm", 95, leaves_in_s=1.5)
        finally:
            await store.close()

    async def keep_cli_full() -> None:  # until the run the CLI made is throttled
        store = open_store(database_url)
        await store.open()
        try:
            async with asyncio.timeout(30):
                while not (found := await store.list_runs("default", agent_name="code")):
                    await fill(store, "tpm", 95, leaves_in_s=1.5)
                    await asyncio.sleep(0.1)
                await keep_full(store, "tpm", found[0].id)
        finally:
            await store.close()

    asyncio.run(prepare())
    filler = threading.Thread(target=lambda: asyncio.run(keep_cli_full()), daemon=True)
    filler.start()
    env = {**fake.env(), "LANTERN_DATABASE_URL": database_url}
    app = "tests.integration.rate_limit_app:app"
    done = in_process("run", "code", "--input", '{"who": "Ada"}', "--wait", "--app", app, env=env)
    filler.join(10)
    assert done.returncode == 0, (done.stdout, done.stderr)
    printed = json.loads(done.stdout)
    assert printed["status"] == "succeeded", printed

    async def kinds() -> list[str]:
        store = open_store(database_url)
        await store.open()
        try:
            return [k for k, _, _ in await journal(store, printed["id"])]
        finally:
            await store.close()

    found = asyncio.run(kinds())
    assert "step_throttled" in found and "run_resumed" in found  # parked, then taken again
    assert len(fake.calls()) == 1
