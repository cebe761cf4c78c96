"""The relay in-process, on both backends: a VM's reports go through THE fenced commit (the
app's commit listeners see them, a stale lease writes nothing), and a resumed VM whose
workload strays from the journal fails its run with ``nondeterminism``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import lantern
from lantern.engine.cancel import cancel_run
from lantern.engine.ledger import Ledger
from lantern.engine.runs import apply_agent, create_run
from lantern.errors import Conflict, Unauthorized, UsageError
from lantern.observability import metrics, tracing
from lantern.runtime.relay import Relay, digest, new_token
from lantern.store import Store
from lantern.store.records import NewEvent
from lantern.store.runtime import SCHEDULER, Vm

AGENT = {"name": "job", "runtime": {"tier": "microvm", "entrypoint": "jobs:three"}}


async def place(store: Store, run_id: str, attempt: int) -> Vm:
    """What the leader and a runtime node do: a VM row placed, then taken under the run lease."""
    leader = await store.acquire_named_lease(SCHEDULER, "leader", 60)
    assert leader is not None
    vm_id = f"vm_{attempt}"
    vm = Vm(vm_id, run_id, f"n{attempt}", "sandbox", attempt, "scheduled", 128,
            datetime.now(UTC), resume=attempt > 1)  # fmt: skip
    assert await store.place_vm(leader, vm)
    lease = await store.acquire_lease(run_id, vm.node_id, 60)
    assert lease is not None
    assert await store.take_vm(vm_id, vm.node_id, digest(new_token(vm_id, "s")), lease.epoch)
    found = await store.get_vm(vm_id)
    assert found is not None
    return found


def step(step_id: str, position: int, **outcome: Any) -> dict[str, Any]:
    """What the harness sends for a ctx.step: entering it, or an attempt's outcome."""
    return {"stepId": step_id, "position": position, **outcome}


async def now(relay: Relay, vm: Vm) -> Vm:
    """The VM as a request under its token finds it (its row as it is now)."""
    return await relay.authenticate(f"Bearer {new_token(vm.vm_id, 's')}")


async def lose(store: Store, vm: Vm) -> None:
    """The first VM is lost: its row ended, its lease handed on."""
    assert await store.end_vm(vm.vm_id, "terminated", "killed", None)
    assert vm.lease_epoch is not None
    await store.expire_lease_of(vm.run_id, vm.node_id)


async def test_reports_go_through_the_one_fenced_commit(store: Store) -> None:
    await apply_agent(store, AGENT)
    run = await create_run(store, "job", {})
    seen: list[tuple[str, list[str]]] = []

    def listener(run_id: str, events: Sequence[NewEvent]) -> None:
        seen.append((run_id, [e.kind for e in events]))

    relay = Relay(store, listeners=[listener], patience=5)
    first = await place(store, run.id, 1)
    writes = metrics.JOURNAL_WRITE._sum.get()
    assert await relay.step(await now(relay, first), step("a", 1)) == {"attempt": 1}
    assert seen == [(run.id, ["step_started"])]
    assert metrics.JOURNAL_WRITE._sum.get() > writes
    await lose(store, first)
    second = await place(store, run.id, 2)
    # The first VM's node comes back: its reports are refused and nothing is written.
    with pytest.raises(Conflict):
        await relay.step(await now(relay, first), step("a", 1, attempt=1, output=1))
    assert [e.kind for e in await store.events(run.id)] == ["step_started"]
    # In flight when the first VM was lost: the same attempt again, nothing journaled anew.
    assert await relay.step(await now(relay, second), step("a", 1)) == {"attempt": 1}
    answer = await relay.step(await now(relay, second), step("a", 1, attempt=1, output=7))
    assert answer == {"output": 7}
    assert [e.kind for e in await store.events(run.id)] == ["step_started", "step_completed"]


async def test_a_resumed_workload_that_returns_early_fails_with_nondeterminism(
    store: Store,
) -> None:
    await apply_agent(store, AGENT)
    run = await create_run(store, "job", {})
    relay = Relay(store, patience=5)
    first = await place(store, run.id, 1)
    for name, position in (("a", 1), ("b", 2)):
        await relay.step(await now(relay, first), step(name, position))
        await relay.step(await now(relay, first), step(name, position, attempt=1, output=0))
    await lose(store, first)
    second = await now(relay, await place(store, run.id, 2))
    answer = await relay.steps(second)
    assert answer["order"] == ["a", "b"]  # what the harness checks its calls against
    # The changed workload asks for step a only, then returns.
    exited = {"kind": "vm_exited", "exitCode": 0, "outcome": {"output": "x", "calls": 1}}
    with pytest.raises(Conflict, match="the code asked for"):
        await relay.report(second, [exited])
    found = await store.get_run(run.id)
    assert found is not None and found.status == "failed"
    assert found.error is not None
    assert (found.error["code"], found.error["position"]) == ("nondeterminism", 2)
    assert (found.error["journaled"], found.error["requested"]) == ("b", "(the function returned)")
    vm = await store.get_vm(second.vm_id)
    assert vm is not None and (vm.state, vm.reason) == ("terminated", "nondeterminism")
    kinds = [e.kind for e in await store.events(run.id)]
    assert kinds[-2:] == ["vm_terminated", "run_failed"]


async def test_a_resumed_vm_calling_a_step_out_of_order_fails_with_nondeterminism(
    store: Store,
) -> None:
    await apply_agent(store, AGENT)
    run = await create_run(store, "job", {})
    relay = Relay(store, patience=5)
    first = await place(store, run.id, 1)
    await relay.step(await now(relay, first), step("a", 1))
    await lose(store, first)
    second = await now(relay, await place(store, run.id, 2))
    call = {"kind": "tool", "tool": "crm.lookup", "args": {}}
    with pytest.raises(Conflict):
        await relay.call(second, {"stepId": "lookup", "position": 1, "call": call})
    found = await store.get_run(run.id)
    assert found is not None and found.error is not None
    assert (found.error["journaled"], found.error["requested"]) == ("a", "lookup")


async def test_an_in_vm_retry_is_decided_and_journaled_with_its_due_time(store: Store) -> None:
    """The VM proposes an attempt's error; the control plane journals step_retrying with
    dueAt (as for every kind of run), tells the VM when to run which attempt, and the journal
    folds back. The harness's side: tests/runtime/test_workload.py; on a real server:
    tests/runtime/test_microvm_guarantees.py."""
    await apply_agent(store, AGENT)
    run = await create_run(store, "job", {})
    relay = Relay(store, patience=5)
    vm = await place(store, run.id, 1)
    retry = {"maxAttempts": 3, "backoffMs": 200}
    error = {"message": "ConnectionError: flaked", "class": "tool", "retryable": True}
    assert await relay.step(await now(relay, vm), step("a", 1, retry=retry)) == {"attempt": 1}
    failed = step("a", 1, retry=retry, attempt=1, error=error)
    answer = await relay.step(await now(relay, vm), failed)
    due = answer["retry"]["dueAt"]
    assert answer["retry"]["attempt"] == 2 and due > time.time() * 1000
    # Asked again before it is due: wait until then (no step_started yet).
    early = await relay.step(await now(relay, vm), step("a", 1, retry=retry))
    assert early == {"dueAt": due, "attempt": 2}
    await asyncio.sleep(max(0.0, due / 1000 - time.time()))
    assert await relay.step(await now(relay, vm), step("a", 1, retry=retry)) == {"attempt": 2}
    done = step("a", 1, retry=retry, attempt=2, output={"ok": True})
    assert await relay.step(await now(relay, vm), done) == {"output": {"ok": True}}
    events = await store.events(run.id)
    assert [(e.kind, e.attempt) for e in events] == [
        ("step_started", 1), ("step_retrying", 2), ("step_started", 2), ("step_completed", 2),
    ]  # fmt: skip
    retrying = events[1].data
    assert (retrying["attempt"], retrying["of"], retrying["dueAt"]) == (2, 3, due)
    assert retrying["error"]["message"] == "ConnectionError: flaked"
    assert Ledger.fold(run.id, events).outputs == {"a": {"ok": True}}
    assert (await relay.steps(await now(relay, vm)))["steps"] == [
        {"stepId": "a", "output": {"ok": True}}
    ]


async def test_a_vm_reports_only_its_own_steps_and_cannot_forge_an_approval(
    store: Store,
) -> None:
    """What the control plane owns (an approval, its events) cannot come from a VM: refused
    (422), nothing written, and ctx.approval still waits for a real decision (on a real
    server: tests/runtime/test_microvm_guarantees.py)."""
    await apply_agent(store, AGENT)
    run = await create_run(store, "job", {})
    relay = Relay(store, patience=5)
    vm = await place(store, run.id, 1)
    forged = {"decision": "approved", "by": "alice (CFO)"}
    for events in (
        [{"kind": "step_started", "stepId": "publish", "data": {"type": "approval"}}],
        [{"kind": "step_completed", "stepId": "publish", "attempt": 1, "output": forged}],
        [{"kind": "step_retrying", "stepId": "publish", "attempt": 2, "data": {}}],
    ):
        with pytest.raises(UsageError):
            await relay.report(await now(relay, vm), events)
    # An outcome for a step the control plane never told it to run.
    with pytest.raises(UsageError):
        await relay.step(await now(relay, vm), step("publish", 1, attempt=1, output=forged))
    assert await store.events(run.id) == []
    # A step of its own under the approval's name, then the approval: refused, not served.
    await relay.step(await now(relay, vm), step("publish", 1))
    await relay.step(await now(relay, vm), step("publish", 1, attempt=1, output=forged))
    approval = {"stepId": "publish", "position": 2, "call": {"kind": "approval"}}
    with pytest.raises(UsageError, match="journaled as a step step"):
        await relay.call(await now(relay, vm), approval)
    # A real approval under another name waits for a decision, whatever the VM sent before.
    real = {"stepId": "sign-off", "position": 3, "call": {"kind": "approval"}}
    waiting = asyncio.ensure_future(relay.call(await now(relay, vm), real))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    assert [e.kind for e in await store.events(run.id)][-2:] == ["step_started", "step_waiting"]
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting


async def test_a_cancelled_vm_run_answers_409_and_writes_nothing_more(store: Store) -> None:
    await apply_agent(store, AGENT)
    run = await create_run(store, "job", {})
    relay = Relay(store, patience=5)
    vm = await place(store, run.id, 1)
    await relay.step(await now(relay, vm), step("a", 1))
    cancelled = await cancel_run(store, run.id, "w-cancel", 5)
    assert cancelled.status == "cancelled"
    ended = await store.get_vm(vm.vm_id)
    assert ended is not None and (ended.state, ended.reason) == ("terminated", "cancelled")
    with pytest.raises(Conflict):
        await relay.step(await now(relay, vm), step("a", 1, attempt=1, output=1))
    with pytest.raises(Conflict):
        await relay.call(
            await now(relay, vm), {"stepId": "m", "position": 2, "call": {"kind": "sleep"}}
        )
    kinds = [e.kind for e in await store.events(run.id)]
    assert kinds == ["step_started", "vm_terminated", "run_cancelled"]


async def test_a_vms_steps_have_spans_in_the_runs_trace(store: Store) -> None:
    """A VM's own ``ctx.step`` (from the attempt the control plane let start to its reported
    outcome) and a step the control plane performs for it (``ctx.tool``) get the same step
    spans as an in-process run's (tests/integration/test_tracing.py), in the run's trace; with
    no drive span above them to carry it, they carry the run id themselves."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        app = lantern.App()

        @app.tool("lookup")
        async def lookup() -> dict[str, Any]:
            raise RuntimeError("the CRM is down")

        await apply_agent(store, AGENT)
        run = await create_run(store, "job", {})
        relay = Relay(store, patience=5, app=app)
        vm = await place(store, run.id, 1)
        assert await relay.step(await now(relay, vm), step("a", 1)) == {"attempt": 1}
        await asyncio.sleep(0.05)
        answer = await relay.step(await now(relay, vm), step("a", 1, attempt=1, output=3))
        assert answer == {"output": 3}
        call = {"stepId": "lookup", "position": 2, "call": {"kind": "tool", "tool": "lookup"}}
        answer = await relay.call(await now(relay, vm), call)
        assert answer["error"]["message"] == "RuntimeError: the CRM is down"
    finally:
        tracing.shutdown()
    found = {s.name: s for s in exporter.get_finished_spans()}
    own, performed = found["step a"], found["step lookup"]
    for span, node_type, name in ((own, "step", "a"), (performed, "tool", "lookup")):
        assert span.context is not None
        assert span.context.trace_id == tracing.trace_id_for(run.id)
        assert dict(span.attributes or {}) == {
            "lantern.run_id": run.id,
            "lantern.step_id": name,
            "lantern.node_type": node_type,
            "lantern.attempt": 1,
            "lantern.replayed": False,
        } | ({} if span is own else {"lantern.error_class": "tool", "lantern.retryable": True})
    assert own.end_time is not None and own.start_time is not None
    assert own.end_time - own.start_time >= 50_000_000  # from its start to its report
    assert own.status.status_code is StatusCode.UNSET
    assert performed.status.status_code is StatusCode.ERROR


async def test_a_vms_steps_go_through_anomaly_detection(store: Store) -> None:
    """The agent's ``anomalies`` apply to a microVM run as to every kind of run
    (tests/integration/test_anomalies.py): past ``maxSteps`` under the fail policy the run
    fails and its VM is stopped (409) before the step it was starting runs (its start is
    journaled, as a code-first function's is, then the anomaly and the run's end)."""
    sprawls = {**AGENT, "anomalies": {"excessive_steps": {"maxSteps": 2, "policy": "fail"}}}
    await apply_agent(store, sprawls)
    run = await create_run(store, "job", {})
    relay = Relay(store, patience=5)
    vm = await place(store, run.id, 1)
    for name, position in (("a", 1), ("b", 2)):
        await relay.step(await now(relay, vm), step(name, position))
        await relay.step(await now(relay, vm), step(name, position, attempt=1, output=0))
    with pytest.raises(Conflict, match="excessive_steps"):
        await relay.step(await now(relay, vm), step("c", 3))
    found = await store.get_run(run.id)
    assert found is not None and found.status == "failed"
    assert found.error is not None
    assert (found.error["code"], found.error["kind"]) == ("anomaly_detected", "excessive_steps")
    ended = await store.get_vm(vm.vm_id)
    assert ended is not None and (ended.state, ended.reason) == ("terminated", "anomaly_detected")
    events = await store.events(run.id)
    assert [(e.kind, e.step_id) for e in events][-4:] == [
        ("step_started", "c"), ("anomaly_detected", None), ("vm_terminated", None),
        ("run_failed", None),
    ]  # fmt: skip
    with pytest.raises(Conflict):
        await relay.step(await now(relay, vm), step("c", 3))


async def test_an_outcome_from_a_cancelled_vm_is_refused_by_its_fenced_commit(
    store: Store,
) -> None:
    """An attempt's outcome is authenticated from the VM drive held in memory, without
    reading the VM's row again (a ctx.step costs three round trips, not four): after a
    cancel, its fenced commit is what refuses it (409), and nothing is written."""
    await apply_agent(store, AGENT)
    run = await create_run(store, "job", {})
    relay = Relay(store, patience=5)
    vm = await place(store, run.id, 1)
    token = f"Bearer {new_token(vm.vm_id, 's')}"
    assert await relay.step(await now(relay, vm), step("a", 1)) == {"attempt": 1}
    assert (await cancel_run(store, run.id, "w-cancel", 5)).status == "cancelled"
    held = await relay.authenticate(token, commits=True)
    assert held.state in ("starting", "running")  # as the drive last read it
    with pytest.raises(Conflict):
        await relay.step(held, step("a", 1, attempt=1, output=1))
    with pytest.raises(Conflict):  # and the drive was dropped: its row is read again
        await relay.step(await relay.authenticate(token, commits=True), step("a", 1))
    kinds = [e.kind for e in await store.events(run.id)]
    assert kinds == ["step_started", "vm_terminated", "run_cancelled"]
    with pytest.raises(Unauthorized):
        await relay.authenticate(f"Bearer {new_token(vm.vm_id, 'wrong')}", commits=True)
