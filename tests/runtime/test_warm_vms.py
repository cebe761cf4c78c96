"""Warm VMs: booted before their run, each used once (real nodes, real sandboxes)."""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from lantern.runtime.channel import serve
from lantern.runtime.drivers import Driver
from lantern.runtime.warm import WarmPool
from tests.runtime.cluster import Cluster
from tests.runtime.conftest import working
from tests.runtime.test_microvm_runs import kinds
from tests.runtime.vms import APPS, decided

pytestmark = pytest.mark.timeout(240)


def warm_ids(log: Path) -> dict[str, str]:
    """The node's word for which warm VM each of its VMs was."""
    return dict(re.findall(r"VM (\S+) is warm VM (\S+)", log.read_text()))


def test_each_run_gets_a_warm_vm_of_its_own_that_holds_nothing_of_another(
    cluster: Cluster,
) -> None:
    node = cluster.node("n1", warm=1)
    cluster.agent("look", "jobs:looks_around")
    outputs, vm_ids = [], []
    for _ in range(3):
        run = cluster.finished(cluster.start_run("look", {}))
        assert run["status"] == "succeeded", run
        outputs.append(run["output"])
        [vm] = cluster.vms(run["id"])
        vm_ids.append(vm["vmId"])
        started = next(e for e in cluster.events(run["id"]) if e["kind"] == "vm_started")
        assert started["data"]["warm"] is True
    used = warm_ids(node.log)
    assert sorted(used) == sorted(vm_ids)  # every run had a warm VM...
    assert len(set(used.values())) == 3  # ...and never one another run had
    for output, vm_id in zip(outputs, vm_ids, strict=True):
        assert output["tmp"] == []  # nothing left by an earlier run
        assert output["env"]["LANTERN_VM_ID"] == vm_id  # its own run's, given at placement
        assert "LANTERN_RESUME" not in output["env"] and output["resumed"] is False


def test_a_run_resumed_after_node_loss_gets_a_warm_vm_told_it_resumes(cluster: Cluster) -> None:
    n1 = cluster.node("n1", warm=0)
    cluster.agent("job", "jobs:three")
    run_id = cluster.start_run("job", {"hold": 120})

    def holding_b() -> bool:
        """step b started"""
        return ("step_started", "b") in kinds(cluster.events(run_id))

    cluster.wait_for(holding_b)
    n2 = cluster.node("n2", warm=1)
    cluster.wait_for(lambda: "warm VM" in n2.log.read_text() and "ready" in n2.log.read_text())
    n1.signal(signal.SIGKILL)
    run = cluster.finished(run_id)
    assert run["status"] == "succeeded", run
    assert run["output"]["resumed"] is True  # LANTERN_RESUME=1 reached the warm VM's harness
    first, second = cluster.vms(run_id)
    assert (first["nodeId"], first["reason"], second["nodeId"]) == ("n1", "node_lost", "n2")
    assert second["vmId"] in warm_ids(n2.log)
    assert kinds(cluster.events(run_id)).count(("step_completed", "a")) == 1


async def _booted(pool: WarmPool) -> None:
    for _ in range(2400):
        if pool.idle:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("no warm VM booted")


async def _one_run(pool: WarmPool, entrypoint: str) -> dict[str, Any]:
    await _booted(pool)
    warm = pool.take(256, 1)
    assert warm is not None
    seen: dict[str, Any] = {"id": warm.spec.vm_id}

    async def handle(op: str, request: dict[str, Any]) -> Any:
        if op == "hello":
            return {"runId": "run-warm", "entrypoint": entrypoint, "input": {}, "env": {}}
        if op == "step":
            return decided(request)
        seen[op] = request
        return None

    try:
        await asyncio.wait_for(
            asyncio.gather(serve(warm.vm, handle, warm.hello), warm.vm.wait()), 240
        )
    finally:
        warm.vm.kill()
    return seen


def _pool_runs(driver: Driver, tmp_path: Path) -> None:
    async def body() -> None:
        pool = WarmPool(driver, APPS, size=1, memory_mb=256, workdir=tmp_path)
        pool.fill()
        try:
            first = await _one_run(pool, "jobs:looks_around")
            second = await _one_run(pool, "jobs:looks_around")
            assert first["id"] != second["id"]  # the pool booted a new one for the second
            for seen in (first, second):
                assert seen["done"]["output"]["tmp"] == [], seen
            await _booted(pool)
            assert pool.take(128, 1) is None  # no warm VM of that size...
            assert pool.idle == []  # ...so the one of another size goes...
            await _booted(pool)
            assert [w.spec.memory_mb for w in pool.idle] == [128]  # ...for one of this size
        finally:
            await pool.close()
        assert pool.idle == []

    asyncio.run(body())


def test_a_pool_hands_each_vm_out_once_and_boots_the_size_asked_for(tmp_path: Path) -> None:
    _pool_runs(working("sandbox"), tmp_path)


def test_a_warm_qemu_vm_boots_to_its_question_then_runs_the_job_it_is_given(
    tmp_path: Path,
) -> None:
    """Under software emulation here: the VM waits at ``hello`` with the harness imported."""
    from lantern.runtime.drivers.qemu import QemuDriver
    from lantern.runtime.image import build

    if shutil.which("qemu-system-x86_64") is None:
        working("qemu")
    build(tmp_path / "image")
    driver = QemuDriver(tmp_path / "image")
    assert driver.unavailable() is None, driver.unavailable()

    async def body() -> dict[str, Any]:
        pool = WarmPool(driver, APPS, size=1, memory_mb=256, workdir=tmp_path)
        pool.fill()
        try:
            for _ in range(2400):
                if pool.idle and pool.idle[0].ready:
                    break
                await asyncio.sleep(0.1)
            pool.size = 0  # no replacement: one boot is this test's share of the machine
            warm = pool.take(256, 1)
            assert warm is not None and warm.ready
            seen: dict[str, Any] = {}

            async def handle(op: str, request: dict[str, Any]) -> Any:
                if op == "hello":
                    env = {"LANTERN_VM_ID": "vm-given", "LANTERN_RESUME": "1"}
                    return {"runId": "run-q", "entrypoint": "jobs:looks_around", "input": {},
                            "env": env}  # fmt: skip
                if op == "steps":
                    return {"steps": []}
                if op == "step":
                    return decided(request)
                seen[op] = request
                return None

            try:
                _, code = await asyncio.wait_for(
                    asyncio.gather(serve(warm.vm, handle, warm.hello), warm.vm.wait()), 240
                )
            finally:
                warm.vm.kill()
            seen["exit"] = code
            return seen
        finally:
            await pool.close()

    seen = asyncio.run(body())
    assert seen["exit"] == 0, seen
    output = seen["done"]["output"]
    assert output["env"]["LANTERN_VM_ID"] == "vm-given" and output["resumed"] is True
    assert output["tmp"] == []
