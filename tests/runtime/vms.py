"""Running one workload under a driver with a node-side channel of the test's own."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from lantern.runtime.channel import serve
from lantern.runtime.drivers import Driver, VmSpec

APPS = Path(__file__).parent / "apps"


def decided(request: dict[str, Any]) -> dict[str, Any]:
    """A control plane of the test's own for a ctx.step: attempt 1, and its outcome stands."""
    if "output" in request:
        return {"output": request["output"]}
    return {"error": request["error"]} if "error" in request else {"attempt": 1}


async def run_workload(
    driver: Driver,
    entrypoint: str,
    input: Any,
    *,
    workdir: Path,
    app_dir: Path = APPS,
    memory_mb: int = 256,
    timeout: float = 240,
    log_bytes: int = 8 * 1024 * 1024,
) -> dict[str, Any]:
    """What the harness told its node: ``{"done": ..., "failed": ..., "reports": [...]}``
    (``reports``: what its steps asked and proposed)."""
    seen: dict[str, Any] = {"reports": []}

    async def handle(op: str, request: dict[str, Any]) -> Any:
        if op == "hello":
            return {"runId": "run-test", "entrypoint": entrypoint, "input": input}
        if op == "steps":
            return {"steps": []}
        if op == "step":
            seen["reports"].append(request)
            return decided(request)
        seen[op] = request
        return None

    # A VM id of its own: tests under xdist boot VMs side by side.
    spec = VmSpec(
        f"vm-test-{uuid.uuid4().hex[:12]}",
        app_dir,
        workdir=workdir,
        memory_mb=memory_mb,
        log_bytes=log_bytes,
    )
    vm = await driver.start(spec)
    try:
        _, code = await asyncio.wait_for(asyncio.gather(serve(vm, handle), vm.wait()), timeout)
    finally:
        vm.kill()
    seen["exit"] = code
    seen["log"] = vm.log
    return seen
