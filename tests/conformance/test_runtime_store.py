"""The microVM tier's store role on SQLite and PostgreSQL alike: nodes, VMs, named leases."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from lantern.engine.runs import create_run
from lantern.store import Store
from lantern.store.runtime import SCHEDULER, RuntimeNode, Vm

MICROVM = {"name": "job", "runtime": {"tier": "microvm", "entrypoint": "jobs:main"}}
GRAPH = {"name": "g", "graph": {"nodes": [{"id": "start", "type": "trigger"}], "edges": []}}


def node(node_id: str, capacity: int = 2) -> RuntimeNode:
    now = datetime.now(UTC)
    return RuntimeNode(node_id, "sandbox", capacity, 1024, {"zone": "a"}, now, now)


def vm(vm_id: str, run_id: str, node_id: str, attempt: int = 1) -> Vm:
    return Vm(vm_id, run_id, node_id, "sandbox", attempt, "scheduled", 128, datetime.now(UTC))


async def test_the_named_lease_has_one_holder_and_a_new_epoch_per_holder(store: Store) -> None:
    a = await store.acquire_named_lease(SCHEDULER, "replica-a", 0.5)
    assert a is not None and a.epoch == 1
    assert await store.acquire_named_lease(SCHEDULER, "replica-b", 0.5) is None
    renewed = await store.acquire_named_lease(SCHEDULER, "replica-a", 0.5)
    assert renewed is not None and renewed.epoch == 1  # a renewal keeps the epoch
    await asyncio.sleep(0.6)
    b = await store.acquire_named_lease(SCHEDULER, "replica-b", 5)
    assert b is not None and b.epoch == 2 and b.holder == "replica-b"
    got = await store.get_named_lease(SCHEDULER)
    assert got is not None and (got.holder, got.epoch) == ("replica-b", 2)


async def test_placement_is_fenced_on_the_leaders_epoch(store: Store) -> None:
    await store.put_agent("default", "job", MICROVM)
    run = await create_run(store, "job", {})
    await store.register_node(node("n1"))
    old = await store.acquire_named_lease(SCHEDULER, "replica-a", 0.3)
    assert old is not None
    await asyncio.sleep(0.4)
    new = await store.acquire_named_lease(SCHEDULER, "replica-b", 5)
    assert new is not None
    assert await store.place_vm(old, vm("vm-stale", run.id, "n1")) is False
    assert await store.place_vm(new, vm("vm-1", run.id, "n1")) is True
    assert [v.vm_id for v in await store.run_vms(run.id)] == ["vm-1"]
    assert await store.end_vm("vm-1", "terminated", "node_lost", None, old) is False
    placed = await store.get_vm("vm-1")
    assert placed is not None and placed.state == "scheduled"


async def test_a_vm_goes_from_placed_to_ended_once(store: Store) -> None:
    await store.put_agent("default", "job", MICROVM)
    run = await create_run(store, "job", {})
    await store.register_node(node("n1"))
    leader = await store.acquire_named_lease(SCHEDULER, "r", 5)
    assert leader is not None
    assert await store.runs_needing_vm(10) == [run.id]
    assert await store.place_vm(leader, vm("vm-1", run.id, "n1"))
    assert await store.runs_needing_vm(10) == []  # it has a live VM
    assert not await store.take_vm("vm-1", "n2", "digest", 1)  # not the node it is placed on
    assert await store.take_vm("vm-1", "n1", "digest", 7)
    assert not await store.take_vm("vm-1", "n1", "digest", 7)
    assert await store.set_vm_running("vm-1")
    nodes = await store.list_nodes()
    assert [(n.node_id, n.running, n.memory_used_mb, n.labels) for n in nodes] == [
        ("n1", 1, 128, {"zone": "a"})
    ]
    assert await store.end_vm("vm-1", "exited", "exited", 0)
    assert not await store.end_vm("vm-1", "terminated", "killed", None)
    got = await store.get_vm("vm-1")
    assert got is not None
    assert (got.state, got.reason, got.exit_code, got.lease_epoch) == ("exited", "exited", 0, 7)
    assert got.started_at is not None and got.ended_at is not None
    assert [v.vm_id for v in await store.node_vms("n1")] == []
    assert [v.vm_id for v in await store.node_vms("n1", live=False)] == ["vm-1"]
    assert await store.runs_needing_vm(10) == [run.id]  # no live VM, no live lease


async def test_only_microvm_runs_without_a_live_lease_need_a_vm(store: Store) -> None:
    await store.put_agent("default", "job", MICROVM)
    await store.put_agent("default", "g", GRAPH)
    await create_run(store, "g", {})
    held = await create_run(store, "job", {})
    lease = await store.acquire_lease(held.id, "node-x", 30)
    assert lease is not None
    assert await store.runs_needing_vm(10) == []
    await store.expire_lease_of(held.id, "someone-else")
    assert await store.runs_needing_vm(10) == []
    await store.expire_lease_of(held.id, "node-x")
    assert await store.runs_needing_vm(10) == [held.id]
    # The expired lease keeps its epoch, so the next holder fences the old one.
    again = await store.acquire_lease(held.id, "replica", 30)
    assert again is not None and again.epoch == lease.epoch + 1


async def test_a_flow_controlled_microvm_run_needs_a_vm_only_once_a_claim_took_it(
    store: Store,
) -> None:
    """The claim alone counts a concurrency key's slots (docs/flow-control.md): a queued run
    under flow control that no claim leased is not the scheduler's to place, or a key's second
    run would start in a VM beside its first. A run without flow control is offered at once."""
    keyed = {**MICROVM, "name": "keyed", "concurrency": {"key": "{{ input.c }}", "limit": 1}}
    await store.put_agent("default", "keyed", keyed)
    first = await create_run(store, "keyed", {"c": "acme"})
    second = await create_run(store, "keyed", {"c": "acme"})
    assert await store.runs_needing_vm(10) == []
    [lease] = await store.claim_runs("replica", 30, 10, ("queued",))  # acme's one slot
    assert lease.run_id == first.id
    assert await store.runs_needing_vm(10) == []  # the claim's lease is live
    await store.release_lease(lease)  # as Scheduler.adopt leaves it when it does not lead
    assert await store.runs_needing_vm(10) == [first.id]  # not acme's second
    await store.put_agent("default", "job", MICROVM)
    free = await create_run(store, "job", {})
    assert await store.runs_needing_vm(10) == [first.id, free.id]
    assert (await store.get_run(second.id)).status == "queued"  # type: ignore[union-attr]


async def test_a_stopped_node_is_lost_and_a_registered_one_is_up(store: Store) -> None:
    await store.register_node(node("n1"))
    now = datetime.now(UTC)
    assert [n.state(now, 15) for n in await store.list_nodes()] == ["up"]
    await store.node_stopped("n1")
    assert [n.state(datetime.now(UTC), 15) for n in await store.list_nodes()] == ["lost"]
    await store.register_node(node("n1", capacity=3))
    [back] = await store.list_nodes()
    assert (back.state(datetime.now(UTC), 15), back.capacity) == ("up", 3)


async def test_a_run_never_has_two_live_vms(store: Store) -> None:
    await store.put_agent("default", "job", MICROVM)
    run = await create_run(store, "job", {})
    leader = await store.acquire_named_lease(SCHEDULER, "r", 5)
    assert leader is not None
    assert await store.place_vm(leader, vm("vm-1", run.id, "n1", 1))
    assert not await store.place_vm(leader, vm("vm-2", run.id, "n2", 2))  # vm-1 is live
    assert await store.end_vm("vm-1", "terminated", "node_lost", None, leader)
    assert not await store.place_vm(leader, vm("vm-3", run.id, "n2", 1))  # attempt 1 is taken
    assert await store.place_vm(leader, vm("vm-2", run.id, "n2", 2))
    assert [(v.vm_id, v.state) for v in await store.run_vms(run.id)] == [
        ("vm-1", "terminated"),
        ("vm-2", "scheduled"),
    ]
