"""Warm VMs: booted ahead of their run, each used for one run and then discarded.

A VM's boot does not depend on its run: the guest sees the node's app directory (one per
node), and its harness's first act is to ask the node for its job (``hello``) and wait for the
answer. So a runtime node keeps ``size`` VMs booted up to that question; a placement takes one
and answers it (the run, the entrypoint, the input, and ``LANTERN_RESUME``/``LANTERN_VM_ID``),
and the pool boots a replacement. Under software emulation a boot is seconds of guest CPU (the
kernel, then Python importing the harness), so a warm VM turns placement → first step from the
boot's length into the channel's round trips.

A warm VM serves one run only: it is handed out once, its harness exits when the run ends, and
the node kills it then. Nothing of a run is in a VM before it is taken, so no run can see
another's input or environment. The pool keeps the size of the VMs placements ask for: a VM
whose memory or vCPUs fit no placement is replaced by one of the size that was asked for.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from lantern.runtime.drivers import Driver, Vm, VmSpec

log = logging.getLogger("lantern.node")
RETRY_S = 5.0  # after a warm VM failed to boot: not a tight loop on a host that cannot


@dataclass
class Warm:
    """A booted VM waiting for its job; ``hello`` is its first line (its question)."""

    vm: Vm
    spec: VmSpec
    hello: asyncio.Task[bytes]
    booted: float = field(default_factory=time.monotonic)

    @property
    def ready(self) -> bool:
        return bool(self._line())

    @property
    def dead(self) -> bool:
        return self.hello.done() and not self._line()

    def _line(self) -> bytes:
        if not self.hello.done() or self.hello.cancelled() or self.hello.exception() is not None:
            return b""
        return self.hello.result()


class WarmPool:
    def __init__(
        self,
        driver: Driver,
        app_dir: Path,
        *,
        size: int,
        memory_mb: int = 512,
        vcpus: int = 1,
        workdir: Path | None = None,
        log_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self.driver = driver
        self.app_dir = app_dir
        self.size = size
        self.shape = (memory_mb, vcpus)  # what the next boots get: what was last asked for
        self.workdir = workdir
        self.log_bytes = log_bytes
        self.idle: list[Warm] = []
        self._booting = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def fill(self) -> None:
        """Boot VMs until ``size`` are idle or booting."""
        while not self._closed and len(self.idle) + self._booting < self.size:
            self._booting += 1
            task = asyncio.create_task(self._boot(self.shape), name="warm VM")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def take(self, memory_mb: int, vcpus: int) -> Warm | None:
        """A warm VM of exactly this size, ready ones first, or None. Either way the pool
        boots VMs of this size from now on, replacing an idle one of another size."""
        self._prune()
        self.shape = (memory_mb, vcpus)
        fits = [w for w in self.idle if (w.spec.memory_mb, w.spec.vcpus) == self.shape]
        found = None
        if fits:
            found = max(fits, key=lambda w: (w.ready, -w.booted))
            self.idle.remove(found)
        else:
            misfits = [w for w in self.idle if w not in fits]
            if misfits:  # make room for one of the size that is wanted
                oldest = min(misfits, key=lambda w: w.booted)
                self.idle.remove(oldest)
                self._discard(oldest)
        self.fill()
        return found

    async def close(self) -> None:
        """Kill every warm VM (the boots under way first finish starting)."""
        self._closed = True
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for warm in self.idle:
            self._discard(warm)
        self.idle.clear()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _prune(self) -> None:
        for warm in [w for w in self.idle if w.dead]:
            log.warning("warm VM %s died before its run: %s", warm.spec.vm_id, warm.vm.log[-300:])
            self.idle.remove(warm)
            self._discard(warm)

    def _discard(self, warm: Warm) -> None:
        warm.hello.cancel()
        warm.vm.kill()
        task = asyncio.create_task(_reap(warm.vm), name="warm VM reaped")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _boot(self, shape: tuple[int, int]) -> None:
        memory_mb, vcpus = shape
        vm_id = f"warm-{uuid.uuid4().hex[:12]}"
        spec = VmSpec(
            vm_id,
            self.app_dir,
            memory_mb=memory_mb,
            vcpus=vcpus,
            workdir=None if self.workdir is None else self.workdir / vm_id,
            log_bytes=self.log_bytes,
        )
        started = time.monotonic()
        try:
            vm = await self.driver.start(spec)
        except Exception as exc:
            log.warning("warm VM did not start: %s", exc)
            self._later()
            return
        finally:
            self._booting -= 1
        warm = Warm(vm, spec, asyncio.ensure_future(_first_line(vm)))
        if self._closed:
            self._discard(warm)
            return
        self.idle.append(warm)
        warm.hello.add_done_callback(lambda _: self._ready(warm, started))

    def _later(self) -> None:
        """Boot again in a while: not a tight loop on a host where boots fail."""
        if not self._closed:
            asyncio.get_running_loop().call_later(RETRY_S, self.fill)

    def _ready(self, warm: Warm, started: float) -> None:
        if warm.ready:
            took = time.monotonic() - started
            log.info("warm VM %s ready in %.1f s", warm.spec.vm_id, took)
        elif warm in self.idle and not self._closed:
            self._prune()
            self._later()


async def _first_line(vm: Vm) -> bytes:
    try:
        return await vm.reader.readline()
    except (ValueError, ConnectionError):
        return b""


async def _reap(vm: Vm) -> None:
    with suppress(Exception):
        await vm.wait()
