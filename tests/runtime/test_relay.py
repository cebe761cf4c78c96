"""The relay in-process, on both backends: a VM's reports go through THE fenced commit (the
app's commit listeners see them, a stale lease writes nothing), and a resumed VM whose
workload strays from the journal fails its run with ``nondeterminism``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from lantern.engine.runs import apply_agent, create_run
from lantern.errors import Conflict
from lantern.observability import metrics
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


def step(kind: str, step_id: str, position: int, **more: Any) -> dict[str, Any]:
    return {"kind": kind, "stepId": step_id, "attempt": 1, "position": position, **more}


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
    assert await relay.report(first, [step("step_started", "a", 1)]) == 1
    assert seen == [(run.id, ["step_started"])]
    assert metrics.JOURNAL_WRITE._sum.get() > writes
    await lose(store, first)
    second = await place(store, run.id, 2)
    # The first VM's node comes back: its reports are refused and nothing is written.
    with pytest.raises(Conflict):
        await relay.report(first, [step("step_completed", "a", 1, output=1)])
    assert [e.kind for e in await store.events(run.id)] == ["step_started"]
    assert await relay.report(second, [step("step_started", "a", 1)]) == 1


async def test_a_resumed_workload_that_returns_early_fails_with_nondeterminism(
    store: Store,
) -> None:
    await apply_agent(store, AGENT)
    run = await create_run(store, "job", {})
    relay = Relay(store, patience=5)
    first = await place(store, run.id, 1)
    for name, position in (("a", 1), ("b", 2)):
        await relay.report(
            first,
            [
                step("step_started", name, position),
                step("step_completed", name, position, output=0),
            ],
        )
    await lose(store, first)
    second = await place(store, run.id, 2)
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
    await relay.report(first, [step("step_started", "a", 1)])
    await lose(store, first)
    second = await place(store, run.id, 2)
    call = {"kind": "tool", "tool": "crm.lookup", "args": {}}
    with pytest.raises(Conflict):
        await relay.call(second, {"stepId": "lookup", "position": 1, "call": call})
    found = await store.get_run(run.id)
    assert found is not None and found.error is not None
    assert (found.error["journaled"], found.error["requested"]) == ("a", "lookup")
