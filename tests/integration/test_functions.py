"""Code-first agents driven in-process on both backends: steps, replay, failures, parking."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import lantern
from lantern.engine.approvals import decide
from lantern.engine.runs import create_run
from lantern.engine.worker import Worker
from lantern.errors import UsageError
from lantern.ids import child_run_id
from lantern.store import Store
from tests.fake_llm import FakeProvider, Script


class Crash(BaseException):
    """Stands for a SIGKILL: nothing in the engine catches it, nothing is cleaned up."""


async def drive(store: Store, app: lantern.App, run_id: str, worker: str = "w1") -> Any:
    async with Worker(store, app, worker_id=worker, lease_ttl=60) as w:
        assert w.runner is not None
        await w.runner.drive(run_id)
    return await store.get_run(run_id)


async def kinds(store: Store, run_id: str) -> list[tuple[str, str | None]]:
    return [(e.kind, e.step_id) for e in await store.events(run_id)]


async def test_steps_run_once_in_order_and_repeats_are_numbered(store: Store) -> None:
    app = lantern.App()
    calls: list[int] = []

    async def noop(k: int) -> dict[str, int]:
        calls.append(k)
        return {"k": k}

    @app.agent("count")
    async def count(ctx: lantern.Context, n: int) -> dict[str, Any]:
        ones = [await ctx.step("one", noop, k) for k in range(n)]
        many = await asyncio.gather(*(ctx.step("many", noop, 10 + k) for k in range(4)))
        return {"ones": ones, "many": many}

    run = await create_run(store, "count", {"n": 2}, app=app)
    done = await drive(store, app, run.id)
    assert done.status == "succeeded", done.error
    assert done.output == {
        "ones": [{"k": 0}, {"k": 1}],
        "many": [{"k": 10}, {"k": 11}, {"k": 12}, {"k": 13}],
    }
    completed = [s for k, s in await kinds(store, run.id) if k == "step_completed"]
    assert None not in completed  # a step event names its step
    assert sorted(s for s in completed if s is not None) == [
        "many",
        "many#2",
        "many#3",
        "many#4",
        "one",
        "one#2",
    ]
    assert sorted(calls) == [0, 1, 10, 11, 12, 13]


async def test_a_crash_replays_completed_steps_and_reruns_the_one_in_flight(store: Store) -> None:
    app = lantern.App()
    seen: list[tuple[str, str]] = []
    crash = {"on": True}

    async def work(ctx: lantern.Context, label: str) -> str:
        seen.append((label, ctx.idempotency_key))
        if label == "b" and crash["on"]:
            crash["on"] = False
            raise Crash()
        return label.upper()

    @app.agent("abc")
    async def abc(ctx: lantern.Context) -> list[str]:
        return [await ctx.step(s, work, ctx, s) for s in ("a", "b", "c")]

    run = await create_run(store, "abc", None, app=app)
    with pytest.raises(Crash):
        await drive(store, app, run.id)
    done = await drive(store, app, run.id)
    assert done.status == "succeeded" and done.output == ["A", "B", "C"]
    labels = [label for label, _ in seen]
    assert labels == ["a", "b", "b", "c"]  # a replayed, b re-run, c once
    assert seen[1][1] == seen[2][1]  # the same attempt, the same key
    events = await store.events(run.id)
    recovered = [e.data for e in events if e.kind == "run_recovered"]
    assert recovered[0]["inFlight"] == ["b"] and recovered[0]["replayed"] == ["a"]


async def test_a_plain_def_agent_gets_a_blocking_context(store: Store) -> None:
    app = lantern.App()

    def double(x: int) -> int:
        return 2 * x

    @app.agent("blocking")
    def blocking(ctx: lantern.Context, xs: list[int]) -> dict[str, Any]:
        keys = []

        def keyed() -> str:
            keys.append(ctx.idempotency_key)
            return ctx.step_id

        out = [ctx.step("double", double, x) for x in xs]
        inside = ctx.step("inside", keyed)
        return {"out": out, "inside": inside, "keys": len(keys)}

    run = await create_run(store, "blocking", {"xs": [1, 2, 3]}, app=app)
    done = await drive(store, app, run.id)
    assert done.status == "succeeded", done.error
    assert done.output == {"out": [2, 4, 6], "inside": "inside", "keys": 1}


async def test_retries_journal_step_retrying_and_a_caught_failure_goes_on(store: Store) -> None:
    app = lantern.App()
    attempts: list[int] = []

    async def flaky(ctx: lantern.Context) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError("peer away")
        return "ok"

    def broken() -> None:
        raise ValueError("no good")

    @app.agent("retry")
    async def retry(ctx: lantern.Context) -> dict[str, Any]:
        got = await ctx.step("flaky", flaky, ctx, retry={"maxAttempts": 3, "backoffMs": 1})
        try:
            await ctx.step("broken", broken)
        except lantern.StepError as exc:
            return {"got": got, "caught": str(exc)}
        return {"got": got}

    run = await create_run(store, "retry", {}, app=app)
    done = await drive(store, app, run.id)
    assert done.status == "succeeded", done.error
    assert done.output == {"got": "ok", "caught": "ValueError: no good"}
    assert attempts == [1, 2, 3]
    events = await store.events(run.id)
    retrying = [e.data for e in events if e.kind == "step_retrying"]
    assert [(r["attempt"], r["of"]) for r in retrying] == [(2, 3), (3, 3)]
    assert "ConnectionError: peer away" in retrying[0]["error"]["message"]
    # Replayed, the caught failure raises its journaled error again without a call.
    again = await drive(store, app, run.id)
    assert again.output == done.output and attempts == [1, 2, 3]


@pytest.mark.parametrize(
    ("body", "code", "says"),
    [
        ("step_not_json", "step_failed", "returned a value the journal cannot store"),
        ("name_not_string", "function_error", "ctx.step: the step name must be a string, not int"),
        ("raises", "function_error", "KeyError: 'missing'"),
        ("returns_not_json", "invalid_output", "the function returned a value"),
        ("times_out", "step_failed", "timed out after 50 ms"),
    ],
)
async def test_user_mistakes_fail_the_run_with_one_clear_line(
    store: Store, body: str, code: str, says: str
) -> None:
    app = lantern.App()

    async def slow() -> None:
        await asyncio.sleep(5)

    @app.agent("mistake")
    async def mistake(ctx: lantern.Context, body: str) -> Any:
        if body == "step_not_json":
            return await ctx.step("bad", lambda: object())
        if body == "name_not_string":
            return await ctx.step(3, lambda: 1)  # type: ignore[arg-type]
        if body == "raises":
            empty: dict[str, Any] = {}
            return empty["missing"]
        if body == "returns_not_json":
            return {1, 2}
        return await ctx.step("slow", slow, timeout_ms=50)

    run = await create_run(store, "mistake", {"body": body}, app=app)
    done = await drive(store, app, run.id)
    assert done.status == "failed"
    assert done.error["code"] == code
    assert says in done.error["message"]
    assert "\n" not in done.error["message"] and "Traceback" not in done.error["message"]


async def test_ctx_kept_past_its_run_and_a_bad_input_are_refused(store: Store) -> None:
    app = lantern.App()
    kept: list[lantern.Context] = []

    @app.agent("keeper")
    async def keeper(ctx: lantern.Context, topic: str) -> str:
        kept.append(ctx)
        return topic

    with pytest.raises(UsageError, match="the input needs 'topic'"):
        await create_run(store, "keeper", {}, app=app)
    run = await create_run(store, "keeper", {"topic": "owls"}, app=app)
    assert (await drive(store, app, run.id)).output == "owls"
    with pytest.raises(UsageError, match="whose drive has ended"):
        await kept[0].step("late", lambda: 1)
    with pytest.raises(UsageError, match="known inside a step only"):
        _ = kept[0].idempotency_key


async def test_code_changed_under_a_pinned_version_is_nondeterminism(store: Store) -> None:
    def make(second: str) -> lantern.App:
        app = lantern.App()

        async def first_step() -> None:
            if second == "crash":
                raise Crash()

        @app.agent("pinned", version="1")
        async def pinned(ctx: lantern.Context) -> str:
            await ctx.step("fetch", lambda: 1)
            await ctx.step("plan", first_step)
            return "done"

        @app.agent("pinned2", version="1")
        async def pinned2(ctx: lantern.Context) -> str:
            await ctx.step("fetch", lambda: 1)
            await ctx.step(second, lambda: 2)
            return "done"

        return app

    old = make("crash")
    run = await create_run(store, "pinned", None, app=old)
    with pytest.raises(Crash):
        await drive(store, old, run.id)
    # The same agent and version, but the code now asks for "summarise" second.
    new = lantern.App()

    @new.agent("pinned", version="1")
    async def pinned(ctx: lantern.Context) -> str:
        await ctx.step("fetch", lambda: 1)
        await ctx.step("summarise", lambda: 2)
        return "done"

    done = await drive(store, new, run.id)
    assert done.status == "failed"
    error = done.error
    assert (error["code"], error["position"]) == ("nondeterminism", 2)
    assert (error["journaled"], error["requested"]) == ("plan", "summarise")
    assert "'plan'" in error["message"] and "'summarise'" in error["message"]


async def test_sleep_parks_with_no_lease_and_wakes_at_its_due_time(store: Store) -> None:
    app = lantern.App()

    @app.agent("nap")
    async def nap(ctx: lantern.Context) -> dict[str, float]:
        before = await ctx.step("before", time.time)
        await ctx.sleep("nap", seconds=0.5)
        after = await ctx.step("after", time.time)
        return {"slept": after - before}

    run = await create_run(store, "nap", None, app=app)
    parked = await drive(store, app, run.id)
    assert parked.status == "waiting"
    assert await store.runs_leased_by("w1") == []
    waiting = [e for e in await store.events(run.id) if e.kind == "step_waiting"]
    assert waiting[0].data["kind"] == "timer"
    # Claimed by the dispatcher once due (here: by hand, after the due time).
    await asyncio.sleep(0.6)
    leases = await store.claim_runs("w2", 60, 10, ("queued",))
    assert [le.run_id for le in leases] == [run.id]
    async with Worker(store, app, worker_id="w2", lease_ttl=60) as w:
        assert w.runner is not None
        await w.runner.drive(run.id, leases[0])
    done = await store.get_run(run.id)
    assert done is not None and done.status == "succeeded", done and done.error
    assert done.output["slept"] >= 0.5
    k = [kind for kind, _ in await kinds(store, run.id)]
    assert "run_resumed" in k and "step_resumed" in k


async def test_an_approval_parks_until_decided(store: Store) -> None:
    app = lantern.App()

    @app.agent("publish")
    async def publish(ctx: lantern.Context) -> dict[str, Any]:
        verdict = await ctx.approval("publish", prompt="Publish?", assignees=["ada"])
        return {"approved": verdict.approved, "by": verdict.by, "comment": verdict.comment}

    run = await create_run(store, "publish", None, app=app)
    parked = await drive(store, app, run.id)
    assert parked.status == "waiting"
    await decide(store, parked, "publish", "approved", "key:k1", "ship it")
    done = await drive(store, app, run.id, worker="w2")
    assert done.status == "succeeded"
    assert done.output == {"approved": True, "by": "key:k1", "comment": "ship it"}


async def test_run_agent_starts_one_child_with_a_derived_id(store: Store) -> None:
    app = lantern.App()

    @app.agent("child")
    async def child(ctx: lantern.Context, x: int) -> dict[str, int]:
        return {"doubled": await ctx.step("double", lambda: 2 * x)}

    @app.agent("parent")
    async def parent(ctx: lantern.Context) -> Any:
        return await ctx.run_agent("child", {"x": 21})

    run = await create_run(store, "parent", None, app=app)
    parked = await drive(store, app, run.id)
    assert parked.status == "waiting"
    kids = await store.children(run.id)
    assert [k.id for k in kids] == [child_run_id(run.id, "child", 1)]
    assert (await drive(store, app, kids[0].id)).status == "succeeded"
    done = await drive(store, app, run.id)
    assert done.status == "succeeded" and done.output == {"doubled": 42}
    assert len(await store.children(run.id)) == 1


async def test_a_replica_without_the_version_leaves_the_run_to_one_with_it(store: Store) -> None:
    def make(version: str) -> lantern.App:
        app = lantern.App()

        @app.agent("versioned", version=version)
        async def versioned(ctx: lantern.Context) -> str:
            which: str = await ctx.step("which", lambda: version)
            return which

        return app

    v1, v2 = make("v1"), make("v2")
    run = await create_run(store, "versioned", None, app=v1)
    left = await drive(store, v2, run.id, worker="new")
    assert left.status == "waiting" and left.waiting_for == "v1"
    parked = [e.data for e in await store.events(run.id) if e.kind == "run_parked"]
    assert parked == [
        {"reason": "version", "version": "v1", "worker": "new", "workerVersion": "v2"}
    ]
    assert await store.runs_waiting_for("versioned", ["v2"]) == []
    assert await store.runs_waiting_for("versioned", ["v1"]) == [run.id]
    done = await drive(store, v1, run.id, worker="old")
    assert done.status == "succeeded" and done.output == "v1" and done.waiting_for is None


async def test_model_tool_and_deliveries_are_steps_replayed_from_the_journal(
    store: Store,
) -> None:
    app = lantern.App()
    delivered: list[str] = []

    @app.tool("crm.note")
    async def note(ctx: lantern.ToolContext, text: str) -> dict[str, str]:
        return {"noted": text, "key": ctx.idempotency_key}

    @app.agent("writer")
    async def writer(ctx: lantern.Context, topic: str) -> dict[str, Any]:
        reply = await ctx.model("offline/echo", prompt=f"about {topic}", system="be brief")
        noted = await ctx.tool("crm.note", text=reply.text)

        async def send() -> str:
            keys = {ctx.idempotency_key, ctx.key_for("mail")}
            delivered.append(ctx.step_id)
            return f"sent {len(keys)}"

        sent = await ctx.deliver_once("mail", send, to="mailto:owls@example.com")
        return {"text": reply.text, "provider": reply.provider, "noted": noted, "sent": sent}

    run = await create_run(store, "writer", {"topic": "owls"}, app=app)
    done = await drive(store, app, run.id)
    assert done.status == "succeeded", done.error
    assert done.output["text"] == "about owls" and done.output["provider"] == "offline"
    assert done.output["noted"]["noted"] == "about owls"
    assert done.output["sent"] == "sent 2" and delivered == ["mail"]
    assert done.usage.model_calls == 1
    (mail,) = await store.deliveries(run.id)
    # Listed as what it is, a delivery the code made, and where it went.
    assert (mail.name, mail.kind, mail.target) == ("mail", "code", "mailto:owls@example.com")
    again = await drive(store, app, run.id)  # finished: nothing runs again
    assert again.output == done.output and delivered == ["mail"]


async def test_a_parked_run_is_cancelled_and_a_running_one_stops(store: Store) -> None:
    from lantern.engine.cancel import cancel_run

    app = lantern.App()
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.sleep(60)

    @app.agent("waits")
    async def waits(ctx: lantern.Context) -> None:
        await ctx.approval("ok", prompt="Go?")

    @app.agent("busy")
    async def busy(ctx: lantern.Context) -> None:
        await ctx.step("done", lambda: 1)
        await ctx.step("forever", forever)

    parked = await create_run(store, "waits", None, app=app)
    assert (await drive(store, app, parked.id)).status == "waiting"
    cancelled = await cancel_run(store, parked.id, "api", 60)
    assert cancelled.status == "cancelled"

    run = await create_run(store, "busy", None, app=app)
    async with Worker(store, app, worker_id="w1", lease_ttl=3) as w:
        assert w.runner is not None
        driving = asyncio.ensure_future(w.runner.drive(run.id))
        await asyncio.wait_for(started.wait(), 10)
        await cancel_run(store, run.id, "api", 3)
        await asyncio.wait_for(driving, 10)
    done = await store.get_run(run.id)
    assert done is not None and done.status == "cancelled"
    assert [k for k, _ in await kinds(store, run.id)][-1] == "run_cancelled"


async def test_a_code_agents_budget_stops_the_model_call_that_would_pass_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeProvider(script=Script(["Hello."])).start()
    try:
        for name, value in fake.env().items():
            monkeypatch.setenv(name, value)
        app = lantern.App()

        @app.agent("thrifty", budget={"maxTokens": 16})
        async def thrifty(ctx: lantern.Context) -> str:
            first = await ctx.model("gpt-4o-mini", prompt="Who is c-1?", name="first")
            second = await ctx.model("gpt-4o-mini", prompt=f"And {first.text}?", name="second")
            return second.text

        run = await create_run(store, "thrifty", None, app=app)
        done = await drive(store, app, run.id)
        calls = fake.calls()
    finally:
        fake.close()
    assert done.status == "failed"
    assert done.error["code"] == "budget_exceeded" and done.error["step"] == "second"
    assert "maxTokens 16" in done.error["message"] and "was not made" in done.error["message"]
    assert len(calls) == 1  # the provider never saw the second call
    saved = await store.get_agent("default", "thrifty")
    assert saved is not None
    assert saved.definition["budget"] == {"maxTokens": 16}
    with pytest.raises(UsageError, match="maxTokens must be a non-negative integer"):
        app.agent("spendthrift", budget={"maxTokens": -1})(thrifty)
    with pytest.raises(UsageError, match="unknown budget fields maxUSD"):
        app.agent("typo", budget={"maxUSD": 1})(thrifty)


async def test_a_code_run_commits_once_per_step_its_opening_with_the_first(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = lantern.App()

    async def noop() -> None:
        return None

    @app.agent("three")
    async def three(ctx: lantern.Context) -> str:
        for name in ("a", "b", "c"):
            await ctx.step(name, noop)
        return "done"

    run = await create_run(store, "three", None, app=app)
    writes: list[list[tuple[str, str | None]]] = []
    append, start_run = store.append, store.start_run

    async def counted_append(batch: Any) -> Any:
        writes.append([(e.kind, e.step_id) for e in batch.events])
        return await append(batch)

    async def counted_start(run_id: str, worker: str, ttl: float, events: Any, update: Any) -> Any:
        writes.append([(e.kind, e.step_id) for e in events])
        return await start_run(run_id, worker, ttl, events, update)

    monkeypatch.setattr(store, "append", counted_append)
    monkeypatch.setattr(store, "start_run", counted_start)
    done = await drive(store, app, run.id)
    assert done.status == "succeeded"
    # As a graph's: the lease, run_started and the first step's start in one transaction,
    # then each step's end with the next one's start.
    assert writes == [
        [("run_started", None), ("step_started", "a")],
        [("step_completed", "a"), ("step_started", "b")],
        [("step_completed", "b"), ("step_started", "c")],
        [("step_completed", "c"), ("run_succeeded", None)],
    ]


async def test_ctx_model_retries_a_transient_error_by_default_and_max_attempts_1_opts_out(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model step of a code agent has the default a graph's ai-step has: a 503 is retried
    after a journaled backoff, each attempt with its own key; ``maxAttempts: 1`` turns it off."""
    fake = FakeProvider(script=Script(["Hello."])).start()
    try:
        for name, value in fake.env().items():
            monkeypatch.setenv(name, value)
        app = lantern.App()

        @app.agent("greet")
        async def greet(ctx: lantern.Context, once: bool) -> str:
            retry = {"maxAttempts": 1} if once else None
            return (await ctx.model("gpt-4o-mini", prompt="Hi", name="hi", retry=retry)).text

        fake.fail("gpt-4o-mini", 503)
        run = await create_run(store, "greet", {"once": False}, app=app)
        done = await drive(store, app, run.id)
        keys = fake.keys()
        fake.fail("gpt-4o-mini", 503)
        strict = await create_run(store, "greet", {"once": True}, app=app)
        refused = await drive(store, app, strict.id)
        all_keys = fake.keys()
    finally:
        fake.close()
    assert done.status == "succeeded" and done.output == "Hello.", done.error
    assert len(keys) == 2 and len(set(keys)) == 2  # two attempts, a key each
    retrying = [e for e in await store.events(run.id) if e.kind == "step_retrying"]
    assert [(e.step_id, e.data["attempt"], e.data["of"]) for e in retrying] == [("hi", 2, 3)]
    assert 250 <= retrying[0].data["delayMs"] <= 500
    assert refused.status == "failed" and refused.error["step"] == "hi"
    assert len(all_keys) == 3  # the opted-out run asked once
