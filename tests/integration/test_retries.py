"""Per-step retry policies and step timeouts, in-process on both backends."""

from __future__ import annotations

import asyncio
from typing import Any

import lantern
from lantern.demo.receiver import Receiver
from lantern.ids import idempotency_key
from lantern.store import Store
from tests.integration.test_runner import graph, run_agent


def flaky_http(receiver: Receiver, **data: Any) -> dict[str, Any]:
    return graph(
        "flaky",
        [
            {
                "id": "call",
                "type": "connector",
                "data": {"connector": "http", "url": f"{receiver.url}/flaky", **data},
            }
        ],
        [("start", "call")],
    )


async def test_a_connector_failing_twice_with_503_succeeds_on_its_third_attempt(
    store: Store, receiver: Receiver
) -> None:
    receiver.fail("/flaky", 503, 2)
    retry = {"maxAttempts": 3, "backoffMs": 20, "retryableClasses": ["connector"]}
    run = await run_agent(store, lantern.App(), flaky_http(receiver, retry=retry), {})
    assert run.status == "succeeded", run.error
    assert receiver.count("/flaky") == 3
    keys = [h.idempotency_key for h in receiver.hits]
    assert keys == [idempotency_key(run.id, "call", n) for n in (1, 2, 3)]
    events = await store.events(run.id)
    retrying = [e for e in events if e.kind == "step_retrying"]
    assert [(e.data["attempt"], e.data["of"]) for e in retrying] == [(2, 3), (3, 3)]
    assert all("503" in e.data["error"]["message"] for e in retrying)
    assert all(e.data["error"]["class"] == "connector" for e in retrying)
    started = [e.attempt for e in events if e.kind == "step_started" and e.step_id == "call"]
    assert started == [1, 2, 3]
    # Each attempt waited out its backoff: it starts no earlier than the journaled due time.
    for r in retrying:
        start = next(
            e for e in events if e.kind == "step_started" and e.attempt == r.data["attempt"]
        )
        assert start.at.timestamp() * 1000 >= r.data["dueAt"] - 1


async def test_an_error_outside_the_retryable_classes_fails_at_once(
    store: Store, receiver: Receiver
) -> None:
    receiver.fail("/flaky", 503, 1)
    retry = {"maxAttempts": 3, "backoffMs": 10, "retryableClasses": ["llm"]}
    run = await run_agent(store, lantern.App(), flaky_http(receiver, retry=retry), {})
    assert run.status == "failed"
    assert run.error["class"] == "connector"
    assert receiver.count("/flaky") == 1
    assert not [e for e in await store.events(run.id) if e.kind == "step_retrying"]


async def test_a_400_is_never_retried_whatever_the_classes(
    store: Store, receiver: Receiver
) -> None:
    receiver.fail("/flaky", 400, 1)
    retry = {"maxAttempts": 3, "backoffMs": 10, "retryableClasses": ["any"]}
    run = await run_agent(store, lantern.App(), flaky_http(receiver, retry=retry), {})
    assert run.status == "failed"
    assert "400" in run.error["message"] and run.error["retryable"] is False
    assert receiver.count("/flaky") == 1


async def test_the_last_attempt_failing_fails_the_run_with_its_error(
    store: Store, receiver: Receiver
) -> None:
    receiver.fail("/flaky", 502, 5)
    retry = {"maxAttempts": 2, "backoffMs": 10}
    run = await run_agent(store, lantern.App(), flaky_http(receiver, retry=retry), {})
    assert run.status == "failed"
    assert receiver.count("/flaky") == 2
    kinds = [(e.kind, e.attempt) for e in await store.events(run.id) if e.step_id == "call"]
    assert kinds == [
        ("step_started", 1),
        ("step_retrying", 2),
        ("step_started", 2),
        ("step_failed", 2),
    ]


async def test_a_step_past_its_timeout_fails_with_the_timeout_class_and_is_retried(
    store: Store,
) -> None:
    app = lantern.App()
    calls: list[int] = []

    @app.tool("slow")
    async def slow(ctx: lantern.ToolContext) -> dict[str, int]:
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            await asyncio.sleep(30)
        return {"attempt": ctx.attempt}

    definition = graph(
        "slow",
        [
            {
                "id": "s",
                "type": "tool",
                "data": {
                    "tool": "slow",
                    "timeoutMs": 200,
                    "retry": {"maxAttempts": 2, "retryableClasses": ["timeout"]},
                },
            }
        ],
        [("start", "s")],
    )
    run = await run_agent(store, app, definition, {})
    assert run.status == "succeeded" and run.output == {"attempt": 2}
    assert calls == [1, 2]
    retrying = [e for e in await store.events(run.id) if e.kind == "step_retrying"]
    assert retrying[0].data["error"]["class"] == "timeout"
    assert "timed out after 200 ms" in retrying[0].data["error"]["message"]


async def test_a_timeout_without_a_retry_policy_fails_the_run(store: Store) -> None:
    app = lantern.App()

    @app.tool("stuck")
    async def stuck() -> None:
        await asyncio.sleep(30)

    definition = graph(
        "stuck",
        [{"id": "s", "type": "tool", "data": {"tool": "stuck", "timeoutMs": 100}}],
        [("start", "s")],
    )
    run = await run_agent(store, app, definition, {})
    assert run.status == "failed" and run.error["class"] == "timeout"


async def test_a_raising_tool_is_retried_under_the_tool_class(store: Store) -> None:
    app = lantern.App()
    seen: list[str] = []

    @app.tool("once_broken")
    def once_broken(ctx: lantern.ToolContext) -> dict[str, str]:
        seen.append(ctx.idempotency_key)
        if len(seen) == 1:
            raise ConnectionError("peer reset")
        return {"ok": "yes"}

    definition = graph(
        "tooly",
        [
            {
                "id": "t",
                "type": "tool",
                "data": {"tool": "once_broken", "retry": {"maxAttempts": 3, "backoffMs": 5}},
            }
        ],
        [("start", "t")],
    )
    run = await run_agent(store, app, definition, {})
    assert run.status == "succeeded"
    assert len(set(seen)) == 2
