"""The drivers, strongest first, and ``auto``: the strongest that works on this host."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lantern.runtime.drivers.base import Driver, DriverUnavailable, Vm, VmSpec
from lantern.runtime.drivers.gvisor import GVisorDriver
from lantern.runtime.drivers.qemu import QemuDriver
from lantern.runtime.drivers.sandbox import SandboxDriver

__all__ = ["DRIVERS", "Check", "Driver", "DriverUnavailable", "Vm", "VmSpec", "check", "pick"]

DRIVERS: dict[str, Driver] = {d.name: d for d in (QemuDriver(), GVisorDriver(), SandboxDriver())}
NAMES = ("auto", *DRIVERS)
PROBE_ENTRYPOINT = "lantern.workload.probe:ping"


@dataclass(frozen=True)
class Check:
    driver: str
    isolation: str
    works: bool
    why: str  # why not, or what the probe saw
    seconds: float


def use_image(path: Path) -> None:
    """Where the ``qemu`` driver finds the image ``lantern runtime build-image`` made."""
    qemu = DRIVERS["qemu"]
    assert isinstance(qemu, QemuDriver)
    qemu.image = path


async def probe(driver: Driver, workdir: Path | None = None, within: float = 120.0) -> Check:
    """Boot one VM under ``driver`` and run the harness's ping workload through the channel."""
    from lantern.runtime.channel import serve

    reason = driver.unavailable()
    if reason is not None:
        return Check(driver.name, driver.isolation, False, reason, 0.0)
    started = time.perf_counter()
    outcome: dict[str, Any] = {}

    async def handle(op: str, request: dict[str, Any]) -> Any:
        if op == "hello":
            return {"runId": "probe", "entrypoint": PROBE_ENTRYPOINT, "input": {}}
        outcome[op] = request
        return None

    spec = VmSpec("probe-" + driver.name, Path(__file__).parent, workdir=workdir, memory_mb=256)
    vm: Vm | None = None
    try:
        vm = await driver.start(spec)
        await asyncio.wait_for(asyncio.gather(serve(vm, handle), vm.wait()), within)
    except (OSError, TimeoutError, DriverUnavailable) as exc:
        if vm is not None:
            vm.kill()
        return Check(driver.name, driver.isolation, False, f"{type(exc).__name__}: {exc}", 0.0)
    seconds = time.perf_counter() - started
    done = outcome.get("done")
    if done is None:
        tail = vm.log.strip().splitlines()[-1:] or ["no output"]
        return Check(
            driver.name, driver.isolation, False, f"the probe VM failed: {tail[0]}", seconds
        )
    output = done["output"]
    privileged = privileges(output)
    if privileged is not None:
        return Check(driver.name, driver.isolation, False, privileged, seconds)
    return Check(driver.name, driver.isolation, True, f"booted: {output['kernel']}", seconds)


def privileges(ping: dict[str, Any]) -> str | None:
    """Why a driver whose probe reported ``ping`` must not run workloads, or None: one that
    cannot drop root's uid or capabilities on this host is refused, not used."""
    uid, caps = ping.get("uid"), str(ping.get("capEff") or "0")
    try:
        capable = int(caps, 16) != 0
    except ValueError:
        capable = True
    if uid == 0 or capable:
        return f"refused: its workloads would run privileged (uid {uid}, CapEff {caps})"
    return None


async def check(workdir: Path | None = None) -> list[Check]:
    """Every driver, probed one after the other (a probe VM is heavy on a small host)."""
    return [await probe(d, workdir) for d in DRIVERS.values()]


async def pick(name: str, workdir: Path | None = None) -> tuple[Driver, list[Check]]:
    """The driver ``name`` names (``auto``: the strongest that works), or DriverUnavailable
    saying why not and what works."""
    if name != "auto" and name not in DRIVERS:
        raise DriverUnavailable(f"unknown driver {name!r}: use one of {', '.join(NAMES)}")
    candidates = list(DRIVERS.values()) if name == "auto" else [DRIVERS[name]]
    checks = []
    for driver in sorted(candidates, key=lambda d: -d.strength):
        result = await probe(driver, workdir)
        checks.append(result)
        if result.works:
            return driver, checks
    why = "; ".join(f"{c.driver}: {c.why}" for c in checks)
    raise DriverUnavailable(f"no driver works on this host ({why})")
