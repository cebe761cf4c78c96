"""A runtime node (``lantern node``): registers, heartbeats, starts the VMs placed on it,
relays their reports to the control plane and holds each run's lease while its VM lives.

Per VM: take the run lease (its epoch goes on the VM's row, and fences every report), make a
token (only its digest is stored), start the VM under the driver, tell the control plane it
started, then answer the VM's channel: ``hello`` (the run), ``steps`` (a resumed VM's completed
steps, from ``GET /v1/runtime/steps``), ``step`` (what a ``ctx.step`` proposes, relayed to
``POST /v1/runtime/step``), ``call`` (``POST /v1/runtime/call``), ``done``/``failed`` (the
workload's own end). Only the node itself reports (``POST /v1/runtime/report``: the VM's
start and end); a VM asking for anything else is refused. A VM refused with 409 (it is
no longer the run's live VM) is killed; so is one whose lease cannot be renewed, and one that
runs past ``timeoutS``. A VM that ends without saying how is reported ``killed`` and its lease
expired at once, so the scheduler resumes the run on another node.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import time
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from lantern.engine import events as ev
from lantern.engine.graph import parse_agent
from lantern.engine.microvm import MicroVmAgent
from lantern.runtime.bytecode import cache_dir, precompile
from lantern.runtime.channel import Refused, serve
from lantern.runtime.drivers import Driver, Vm, VmSpec
from lantern.runtime.drivers.base import GUEST_APP, GUEST_SRC
from lantern.runtime.relay import STEP_FIELDS, digest, new_token
from lantern.runtime.warm import WarmPool
from lantern.store.base import Store
from lantern.store.records import Lease
from lantern.store.runtime import RuntimeNode
from lantern.store.runtime import Vm as VmRow

log = logging.getLogger("lantern.node")
WORKLOAD = Path(__file__).resolve().parent.parent / "workload"  # what every VM imports


@dataclass
class Running:
    row: VmRow
    lease: Lease
    token: str
    handle: Vm | None = None
    ended: bool = False  # the control plane was told how the VM ended
    folder: Path | None = None  # the VM's files on this host (console log, sockets)
    succeeded: bool = False  # its workload ended with an output: nothing to keep
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Node:
    def __init__(
        self,
        store: Store,
        driver: Driver,
        *,
        node_id: str,
        control_url: str,
        app_dir: Path,
        capacity: int = 4,
        memory_mb: int = 4096,
        labels: dict[str, str] | None = None,
        node_ttl: float = 15.0,
        lease_ttl: float = 60.0,
        poll: float = 0.1,
        workdir: Path | None = None,
        warm: int = 0,
        warm_memory_mb: int = 512,
        log_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self.store = store
        self.driver = driver
        self.node_id = node_id
        self.control_url = control_url.rstrip("/")
        self.app_dir = app_dir
        self.capacity = capacity
        self.memory_mb = memory_mb
        self.labels = labels or {}
        self.node_ttl = node_ttl
        self.lease_ttl = lease_ttl
        self.poll = poll
        self.workdir = workdir
        self.log_bytes = log_bytes
        self.pool = WarmPool(
            driver, app_dir, size=warm, memory_mb=warm_memory_mb, workdir=workdir,
            log_bytes=log_bytes,
        )  # fmt: skip
        self.vms: dict[str, Running] = {}
        self._bytecode = cache_dir(app_dir)
        self._tasks: set[asyncio.Task[None]] = set()
        self._http = httpx.AsyncClient(timeout=30)

    def _precompile(self, *more: tuple[Path, str]) -> None:
        """The app's bytecode (and ``more``'s) into the node's own cache, never into --app."""
        precompile(self._bytecode, (self.app_dir, GUEST_APP), *more)

    async def serve(self, stopping: asyncio.Event) -> None:
        now = datetime.now(UTC)
        await self.store.register_node(
            RuntimeNode(
                self.node_id, self.driver.name, self.capacity, self.memory_mb, self.labels, now, now
            )
        )
        log.info("runtime node %s up (driver %s)", self.node_id, self.driver.name)
        # Heartbeats first: compiling a large app directory on a loaded host must not get the
        # node thought lost before its first beat.
        beats = asyncio.create_task(self._heartbeats(stopping))
        try:
            await asyncio.to_thread(self._precompile, (WORKLOAD, f"{GUEST_SRC}/lantern/workload"))
            self.pool.fill()
            while not stopping.is_set():
                try:
                    await self._take_placed()
                except Exception as exc:  # the database is away: try again
                    log.warning("could not read placements: %s", exc)
                with suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), self.poll)
        finally:
            beats.cancel()
            for running in self.vms.values():
                if running.handle is not None:
                    running.handle.kill()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.pool.close()
            with suppress(Exception):
                await self.store.node_stopped(self.node_id)
            await self._http.aclose()

    async def _heartbeats(self, stopping: asyncio.Event) -> None:
        every = self.node_ttl / 3
        while not stopping.is_set():
            try:
                await self.store.heartbeat_node(self.node_id)
                await self._check_live()
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)
            with suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), every)

    async def _check_live(self) -> None:
        """Stop a VM the control plane ended (this node was thought lost, say)."""
        for vm_id, running in list(self.vms.items()):
            row = await self.store.get_vm(vm_id)
            if (row is None or not row.live) and running.handle is not None:
                log.warning(
                    "VM %s is %s on the control plane: stopping it", vm_id, row and row.state
                )
                running.ended = True
                running.handle.kill()

    async def _take_placed(self) -> None:
        rows = await self.store.node_vms(self.node_id)
        live = {row.vm_id for row in rows}
        for vm_id, running in list(self.vms.items()):
            if vm_id not in live and running.handle is not None and not running.ended:
                # Its row ended under it (a cancel, say): stop it within a poll, not a beat.
                log.warning("VM %s was ended on the control plane: stopping it", vm_id)
                running.ended = True
                running.handle.kill()
        for row in rows:
            if row.state == "scheduled" and row.vm_id not in self.vms:
                await self._take(row)

    async def _take(self, row: VmRow) -> None:
        lease = await self.store.acquire_lease(row.run_id, self.node_id, self.lease_ttl)
        if lease is None:
            return  # the scheduler or a sweep still holds it for a moment: next poll
        token = new_token(row.vm_id, secrets.token_urlsafe(24))
        if not await self.store.take_vm(row.vm_id, self.node_id, digest(token), lease.epoch):
            await self.store.release_lease(lease)
            return
        running = Running(row, lease, token)
        self.vms[row.vm_id] = running
        task = asyncio.create_task(self._run(running), name=f"vm {row.vm_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, running: Running) -> None:
        row = running.row
        try:
            await self._live(running)
        except Exception:
            log.exception("VM %s of run %s failed on this node", row.vm_id, row.run_id)
        finally:
            if running.handle is not None:
                running.handle.kill()
            if not running.ended:
                with suppress(Exception):
                    await self._send(running, [{"kind": ev.VM_TERMINATED, "reason": "killed"}])
            if not running.ended:
                # The control plane did not hear of the end (it is away): end the row at least,
                # or the run would keep a live VM that is gone and never be resumed.
                with suppress(Exception):
                    await self.store.end_vm(row.vm_id, "terminated", "killed", None)
            # Hand the run on at once: the scheduler resumes it without waiting for the TTL.
            with suppress(Exception):
                await self.store.release_lease(running.lease)
            self.vms.pop(row.vm_id, None)
            await self._clear(running)

    async def _clear(self, running: Running) -> None:
        """The VM's folder goes when it ends; one that failed keeps its (capped) console log
        for whoever looks into why, the rest of its files removed."""
        if running.handle is not None:
            with suppress(Exception):
                await asyncio.wait_for(running.handle.wait(), 10)
        folder = running.folder
        if folder is None or not folder.is_dir():
            return
        if running.succeeded:
            await asyncio.to_thread(shutil.rmtree, folder, True)
            return
        for path in folder.iterdir():
            if not path.name.startswith("console.log"):
                if path.is_dir() and not path.is_symlink():
                    await asyncio.to_thread(shutil.rmtree, path, True)
                else:
                    path.unlink(missing_ok=True)

    async def _live(self, running: Running) -> None:
        row = running.row
        run = await self.store.get_run(row.run_id)
        agent = await self._agent(row)
        if run is None or agent is None:
            return
        env = {"LANTERN_VM_ID": row.vm_id, **({"LANTERN_RESUME": "1"} if row.resume else {})}
        warm = self.pool.take(row.memory_mb, agent.vcpus)
        first: asyncio.Future[bytes] | None = None
        if warm is not None:
            running.handle = handle = warm.vm
            running.folder = warm.spec.files()
            first = warm.hello
            log.info("VM %s is warm VM %s", row.vm_id, warm.spec.vm_id)
        else:
            spec = VmSpec(
                row.vm_id,
                self.app_dir,
                env=env,
                memory_mb=row.memory_mb,
                vcpus=agent.vcpus,
                workdir=None if self.workdir is None else self.workdir / row.vm_id,
                log_bytes=self.log_bytes,
            )
            running.folder = spec.files()
            await asyncio.to_thread(self._precompile)  # the app changed since, say
            running.handle = handle = await self.driver.start(spec)
        up = {"kind": ev.VM_STARTED, **({"warm": True} if warm is not None else {})}
        if not await self._send(running, [up]):
            return
        keeper = asyncio.create_task(self._keep(running))
        outcome: dict[str, Any] = {}

        async def handle_request(op: str, request: dict[str, Any]) -> Any:
            if op == "hello":
                return {
                    "runId": row.run_id,
                    "workspace": run.workspace,  # an entrypoint may serve some only
                    "entrypoint": agent.entrypoint,
                    "input": run.input,
                    "env": env,
                }
            if op == "steps":
                return await self._steps(running)
            if op == "report":  # the journal's events are the control plane's to write
                raise Refused("a VM proposes only its own steps' outcomes (op 'step')", 422)
            if op == "step":  # ctx.step: which attempt to run, then what it did
                return await self._call(running, request, "step")
            if op == "call":  # ctx.model / ctx.tool / waits: the control plane performs them
                return await self._call(running, request, "call")
            if op in ("done", "failed"):
                outcome[op] = request
                return None
            raise Refused(f"unknown request {op!r}", 400)

        started = time.monotonic()
        try:
            served = asyncio.ensure_future(
                asyncio.gather(serve(handle, handle_request, first), handle.wait())
            )
            try:
                _, code = await asyncio.wait_for(served, agent.timeout_s)
            except TimeoutError:
                handle.kill()
                took = round(time.monotonic() - started)
                message = (
                    f"the workload ran past timeoutS ({agent.timeout_s} s; killed after {took} s)"
                )
                await self._send(
                    running,
                    [{"kind": ev.VM_TERMINATED, "reason": "timeout", "message": message}],
                )
                return
        finally:
            keeper.cancel()
        if running.ended:
            return
        if "done" in outcome:
            running.succeeded = True
            end = {"output": outcome["done"].get("output"), "calls": outcome["done"].get("calls")}
        elif "failed" in outcome:
            end = {"error": outcome["failed"].get("error")}
        else:
            log.warning(
                "VM %s ended without an outcome (exit %s): %s", row.vm_id, code, handle.log[-500:]
            )
            await self._send(
                running, [{"kind": ev.VM_TERMINATED, "reason": "killed", "exitCode": code}]
            )
            return
        await self._send(running, [{"kind": ev.VM_EXITED, "exitCode": code, "outcome": end}])

    async def _keep(self, running: Running) -> None:
        """Renew the run lease while the VM lives; a lost lease stops the VM."""
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            try:
                kept = await self.store.renew_lease(running.lease, self.lease_ttl)
            except Exception as exc:
                log.warning("could not renew the lease of %s: %s", running.row.run_id, exc)
                continue
            if not kept:
                log.warning("run %s was taken from this node: stopping its VM", running.row.run_id)
                running.ended = True
                if running.handle is not None:
                    running.handle.kill()
                return

    async def _agent(self, row: VmRow) -> MicroVmAgent | None:
        run = await self.store.get_run(row.run_id)
        if run is None:
            return None
        found = await self.store.get_agent(run.workspace, run.agent_name, run.agent_version)
        # No model routes (a runtime node has none): a microVM definition names no model.
        agent = None if found is None else parse_agent(found.definition)
        return agent if isinstance(agent, MicroVmAgent) else None

    def _auth(self, running: Running) -> dict[str, str]:
        return {"Authorization": f"Bearer {running.token}"}

    async def _steps(self, running: Running) -> Any:
        response = await self._http.get(
            f"{self.control_url}/v1/runtime/steps", headers=self._auth(running)
        )
        if response.status_code != 200:
            self._refused(running, response)
        return response.json()

    async def _relay(self, running: Running, events: list[dict[str, Any]]) -> None:
        async with running.lock:
            response = await self._http.post(
                f"{self.control_url}/v1/runtime/report",
                json={"events": events},
                headers=self._auth(running),
            )
        if response.status_code != 200:
            self._refused(running, response)

    async def _call(self, running: Running, request: dict[str, Any], path: str) -> Any:
        fields = STEP_FIELDS if path == "step" else ("stepId", "position", "call")
        body = {k: request[k] for k in fields if k in request}
        async with running.lock:
            # A model call takes as long as the model does: no read timeout of ours (the
            # VM's timeoutS bounds it).
            response = await self._http.post(
                f"{self.control_url}/v1/runtime/{path}",
                json=body,
                headers=self._auth(running),
                timeout=httpx.Timeout(30, read=None),
            )
        if response.status_code != 200:
            self._refused(running, response)
        return response.json()

    def _refused(self, running: Running, response: httpx.Response) -> None:
        detail = _detail(response)
        if response.status_code in (401, 409):
            # Not the run's live VM any more: stop it, it must not go on working.
            log.warning("VM %s refused by the control plane: %s", running.row.vm_id, detail)
            running.ended = True
            if running.handle is not None:
                running.handle.kill()
        raise Refused(detail, response.status_code)

    async def _send(self, running: Running, events: list[dict[str, Any]]) -> bool:
        """A report of the node's own (the VM's start or end); False when refused."""
        try:
            await self._relay(running, events)
        except (Refused, httpx.HTTPError) as exc:
            log.warning("report of VM %s not taken: %s", running.row.vm_id, exc)
            return False
        if events[-1]["kind"] in (ev.VM_EXITED, ev.VM_TERMINATED):
            running.ended = True
        return True


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail"))
    except ValueError:
        return response.text[:200]
