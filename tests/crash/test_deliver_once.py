"""ctx.deliver_once under SIGKILL and under a lease stolen from a paused replica."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from lantern.demo.receiver import Receiver
from lantern.engine.runs import apply_agent, create_run
from lantern.store import Store
from tests.crash.processes import Serve
from tests.crash.test_sigkill import wait_for, wait_for_status


def deliveries_agent(url: str, gate_first: bool) -> dict[str, Any]:
    args = {"url": url, "gate_first": gate_first}
    return {
        "name": "pay",
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "pay", "type": "tool", "data": {"tool": "two_deliveries", "args": args}},
            ],
            "edges": [{"source": "start", "target": "pay"}],
        },
    }


async def test_killed_between_two_deliveries_the_first_is_not_repeated(
    store: Store, receiver: Receiver, tmp_path: Path
) -> None:
    await apply_agent(store, deliveries_agent(receiver.url, gate_first=False))
    run = await create_run(store, "pay", {})
    receiver.hold("/gate")
    first = Serve(store.url, tmp_path / "serve.log", LANTERN_WORKER_ID="w1")
    await asyncio.to_thread(receiver.arrived.wait, 30)
    assert [d.status for d in await store.deliveries(run.id)] == ["delivered"]
    first.kill()
    receiver.release()
    second = Serve(store.url, tmp_path / "serve.log", LANTERN_WORKER_ID="w1")
    try:
        await wait_for_status(store, run.id, "succeeded")
    finally:
        second.stop()
    assert (receiver.count("/first"), receiver.count("/second")) == (1, 1)
    assert receiver.keys("/first") != receiver.keys("/second")  # a key of its own each
    receipts = await store.deliveries(run.id)
    assert [(d.name, d.status) for d in receipts] == [
        ("first", "delivered"),
        ("second", "delivered"),
    ]
    finished = await store.get_run(run.id)
    assert finished is not None and finished.output["first"] == receipts[0].response


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_a_replica_that_lost_the_run_does_not_dispatch(
    store: Store, receiver: Receiver, tmp_path: Path
) -> None:
    fast = {"LANTERN_LEASE_TTL": "2s", "LANTERN_RECOVERY_INTERVAL": "500ms"}
    await apply_agent(store, deliveries_agent(receiver.url, gate_first=True))
    run = await create_run(store, "pay", {})
    receiver.hold("/gate")
    paused = Serve(store.url, tmp_path / "paused.log", LANTERN_WORKER_ID="paused", **fast)
    await asyncio.to_thread(receiver.arrived.wait, 30)
    paused.proc.send_signal(signal.SIGSTOP)
    other = Serve(store.url, tmp_path / "other.log", LANTERN_WORKER_ID="other", **fast)
    try:
        await wait_for(lambda: receiver.count("/gate") == 2, timeout=20)  # the other took over
        receiver.release()
        await wait_for_status(store, run.id, "succeeded", timeout=20)
        paused.proc.send_signal(signal.SIGCONT)  # its /gate call returns; its claim is fenced
        await wait_for(lambda: "no longer current" in paused.output(), timeout=10)
    finally:
        paused.proc.send_signal(signal.SIGCONT)
        paused.stop()
        other.stop()
    assert (receiver.count("/first"), receiver.count("/second")) == (1, 1)
    assert [d.status for d in await store.deliveries(run.id)] == ["delivered", "delivered"]
