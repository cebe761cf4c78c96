"""SIGKILL a real `lantern serve` while a run sends three emails, restart it with the same
worker id, and count what the SMTP server received (both backends).

(a) killed right after email 2's step completed (its receipt was recorded delivered before
    that commit): every email arrives exactly once.
(b) killed while email 3's DATA is unanswered: email 3 arrives again after the restart, with
    the same Message-ID; emails 1 and 2 are never re-sent.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lantern.engine.runs import apply_agent, create_run
from lantern.store import Store
from tests.crash.processes import Serve
from tests.crash.test_sigkill import completions, wait_for_status
from tests.integration.test_email import SmtpSink, key_of

MAILS = ["m1", "m2", "m3"]


def three_emails(name: str) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"}]
    edges = []
    previous = "start"
    for k, step in enumerate(MAILS, start=1):
        data = {
            "connector": "email",
            "to": "{{ input.email }}",
            "subject": f"email {k}",
            "text": f"Message {k} for order {{{{ input.order }}}}",
        }
        nodes.append({"id": step, "type": "connector", "data": data})
        edges.append({"source": previous, "target": step})
        previous = step
    return {"name": name, "graph": {"nodes": nodes, "edges": edges}}


@pytest.fixture
def sink() -> Iterator[SmtpSink]:
    s = SmtpSink().start()
    yield s
    s.close()


def received(sink: SmtpSink) -> Counter[str]:
    return Counter(m.subject for m in sink.received())


async def check_finished(store: Store, run_id: str, sink: SmtpSink) -> None:
    events = await store.events(run_id)
    assert completions(events) == {s: 1 for s in ["start", *MAILS]}
    for k, step in enumerate(MAILS, start=1):
        ids = {m.message_id for m in sink.received(f"email {k}")}
        assert ids == {f"<{key_of(run_id, step)}@lantern>"}
        assert all(m.recipients == ("ada@example.test",) for m in sink.received(f"email {k}"))
    receipts = await store.deliveries(run_id)
    assert sorted((d.step_id, d.status) for d in receipts) == [(s, "delivered") for s in MAILS]


async def test_killed_after_email_2_was_recorded_every_email_arrives_once(
    store: Store, sink: SmtpSink, tmp_path: Path
) -> None:
    await apply_agent(store, three_emails("mails"))
    run = await create_run(store, "mails", {"email": "ada@example.test", "order": 42})
    crashing = Serve(
        store.url,
        tmp_path / "serve.log",
        LANTERN_WORKER_ID="w1",
        LANTERN_SMTP_URL=sink.url,
        LANTERN_TEST_CRASH_AFTER="step_completed:m2",
    )
    code = await asyncio.to_thread(crashing.proc.wait, 30)
    crashing.out.close()
    assert code == -9, crashing.output()
    assert completions(await store.events(run.id)) == {"start": 1, "m1": 1, "m2": 1}
    receipts = await store.deliveries(run.id)
    assert sorted((d.step_id, d.status) for d in receipts) == [
        ("m1", "delivered"),
        ("m2", "delivered"),
    ]
    assert received(sink) == {"email 1": 1, "email 2": 1}

    second = Serve(
        store.url, tmp_path / "serve.log", LANTERN_WORKER_ID="w1", LANTERN_SMTP_URL=sink.url
    )
    try:
        await wait_for_status(store, run.id, "succeeded")
    finally:
        second.stop()
    assert received(sink) == {"email 1": 1, "email 2": 1, "email 3": 1}
    await check_finished(store, run.id, sink)


async def test_killed_while_email_3_is_sent_it_is_resent_once_with_the_same_message_id(
    store: Store, sink: SmtpSink, tmp_path: Path
) -> None:
    await apply_agent(store, three_emails("mails"))
    run = await create_run(store, "mails", {"email": "ada@example.test", "order": 7})
    sink.hold("email 3")
    first = Serve(
        store.url, tmp_path / "serve.log", LANTERN_WORKER_ID="w1", LANTERN_SMTP_URL=sink.url
    )
    try:
        assert await asyncio.to_thread(sink.arrived.wait, 30), first.output()
    finally:
        first.kill()  # email 3's DATA is in, its answer is not: the receipt stays claimed
    sink.release()
    [claimed] = [d for d in await store.deliveries(run.id) if d.step_id == "m3"]
    assert claimed.status == "claimed"
    assert received(sink) == {"email 1": 1, "email 2": 1, "email 3": 1}

    second = Serve(
        store.url, tmp_path / "serve.log", LANTERN_WORKER_ID="w1", LANTERN_SMTP_URL=sink.url
    )
    try:
        await wait_for_status(store, run.id, "succeeded")
    finally:
        second.stop()
    # Emails 1 and 2 were recorded delivered and are never re-sent; email 3 was cut off before
    # its outcome was recorded, so it went out again (at most once more) with the same
    # Message-ID, which check_finished compares to the key of m3's first attempt.
    assert received(sink) == {"email 1": 1, "email 2": 1, "email 3": 2}
    await check_finished(store, run.id, sink)
    recovered = [e for e in await store.events(run.id) if e.kind == "run_recovered"]
    assert [e.data["inFlight"] for e in recovered] == [["m3"]]
