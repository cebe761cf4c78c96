"""The control plane's side of ``POST /v1/runtime/report`` and ``GET /v1/runtime/steps``.

A runtime node relays what its VM reported, under the VM's token. A report is journaled only
when the VM is the run's live VM (its row is ``starting`` or ``running`` and it is the run's
newest), and then through the fenced commit, on the run lease the node holds: a VM of a node
thought lost, a VM that was replaced, a finished one, all get 409 and nothing is written.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from lantern.engine import events as ev
from lantern.engine.journal import fold
from lantern.errors import Conflict, LeaseLost, Unauthorized, UsageError
from lantern.runtime import metrics
from lantern.runtime.journal import Listener, commit, vm_data, writer
from lantern.store.base import Store
from lantern.store.codec import dumps
from lantern.store.records import Lease, NewEvent, RunUpdate
from lantern.store.runtime import Vm

STEP_KINDS = (ev.STEP_STARTED, ev.STEP_COMPLETED, ev.STEP_FAILED, ev.STEP_RETRYING)
TOKEN_PREFIX = "lvm"
MAX_STEP_ID = 200


def new_token(vm_id: str, secret: str) -> str:
    return f"{TOKEN_PREFIX}.{vm_id}.{secret}"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Relay:
    def __init__(
        self,
        store: Store,
        *,
        listeners: Sequence[Listener] = (),
        finished: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.listeners = listeners
        self.finished = finished  # issues the receipt of a run a report finished
        self._locks: dict[str, asyncio.Lock] = {}

    async def authenticate(self, authorization: str | None) -> Vm:
        """The VM whose token this is (401 for no token, a malformed or a wrong one)."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.startswith(TOKEN_PREFIX + "."):
            raise Unauthorized("a per-VM token is required (Authorization: Bearer lvm....)")
        vm_id = token[len(TOKEN_PREFIX) + 1 :].rpartition(".")[0]
        vm = await self.store.get_vm(vm_id) if vm_id else None
        if vm is None or vm.token_digest is None:
            raise Unauthorized("unknown VM token")
        if not hmac.compare_digest(vm.token_digest, digest(token)):
            raise Unauthorized("wrong VM token")
        return vm

    async def _live(self, vm: Vm) -> Vm:
        current = await self.store.get_vm(vm.vm_id)
        if current is None or current.state not in ("starting", "running"):
            state = "gone" if current is None else current.state
            raise Conflict(f"VM {vm.vm_id} is {state}: it is not the run's live VM")
        newest = (await self.store.run_vms(vm.run_id))[-1]
        if newest.vm_id != vm.vm_id:
            raise Conflict(f"VM {vm.vm_id} was replaced by {newest.vm_id}")
        return current

    async def steps(self, vm: Vm) -> dict[str, Any]:
        """The run's completed steps and their outputs, in journal order."""
        await self._live(vm)
        state = fold(await self.store.events(vm.run_id, blobs=True))
        return {
            "runId": vm.run_id,
            "steps": [{"stepId": s, "output": o} for s, o in state.outputs.items()],
        }

    async def report(self, vm: Vm, entries: list[Any]) -> int:
        """Journal a batch of reports from ``vm``; the number of events written."""
        if not isinstance(entries, list) or not entries:
            raise UsageError("events must be a non-empty list")
        lock = self._locks.setdefault(vm.run_id, asyncio.Lock())
        try:
            async with lock:
                return await self._report(vm, entries)
        finally:
            if not lock.locked():  # nobody else waits on it: forget it
                self._locks.pop(vm.run_id, None)

    async def _report(self, vm: Vm, entries: list[Any]) -> int:
        vm = await self._live(vm)
        w = await writer(self.store, vm.run_id)
        events: list[NewEvent] = []
        update: RunUpdate | None = None
        ending: tuple[str, str, int | None] | None = None  # state, reason, exit code
        for entry in entries:
            if ending is not None:
                raise UsageError("nothing may follow the report of a VM's end")
            kind = entry.get("kind") if isinstance(entry, dict) else None
            if kind in STEP_KINDS:
                events.append(_step_event(w, kind, entry))
            elif kind == ev.VM_STARTED:
                events.append(w.event(ev.VM_STARTED, vm_data(vm, driver=vm.driver)))
            elif kind == ev.VM_EXITED:
                code = _code(entry)
                outcome = entry.get("outcome")
                if not isinstance(outcome, dict) or not ("output" in outcome or "error" in outcome):
                    raise UsageError("vm_exited needs an outcome with output or error")
                events.append(w.event(ev.VM_EXITED, vm_data(vm, exitCode=code, reason="exited")))
                if "error" in outcome:
                    error = _error(outcome["error"])
                    events.append(w.event(ev.RUN_FAILED, {"error": error}))
                    update = RunUpdate("failed", error=error)
                else:
                    output = json.loads(dumps(outcome["output"]))
                    events.append(w.event(ev.RUN_SUCCEEDED, {"output": output}))
                    update = RunUpdate("succeeded", output=output)
                ending = ("exited", "exited", code)
            elif kind == ev.VM_TERMINATED:
                reason = entry.get("reason")
                if reason not in ("timeout", "killed"):
                    raise UsageError("vm_terminated reason must be timeout or killed")
                code = _code(entry)
                events.append(w.event(ev.VM_TERMINATED, vm_data(vm, exitCode=code, reason=reason)))
                if reason == "timeout":
                    message = str(entry.get("message") or "the workload ran past timeoutS")
                    error = ev.run_error(ev.E_TIMEOUT, message, retryable=False)
                    error["class"] = "timeout"
                    events.append(w.event(ev.RUN_FAILED, {"error": error}))
                    update = RunUpdate("failed", error=error)
                ending = ("terminated", reason, code)
            else:
                raise UsageError(f"a report's kind must be one of {', '.join(STEP_KINDS)}")
        assert vm.lease_epoch is not None
        lease = Lease(vm.run_id, vm.node_id, vm.lease_epoch)
        try:
            await commit(self.store, lease, events, update, self.listeners)
        except LeaseLost as exc:
            raise Conflict(f"VM {vm.vm_id} no longer holds run {vm.run_id}: {exc}") from exc
        if any(e.kind == ev.VM_STARTED for e in events) and await self.store.set_vm_running(
            vm.vm_id
        ):
            placed = (datetime.now(UTC) - vm.created_at).total_seconds()
            metrics.VM_START.labels(vm.driver).observe(placed)
        if ending is not None:
            await self.store.end_vm(vm.vm_id, ending[0], ending[1], ending[2])  # type: ignore[arg-type]
            metrics.VM_ENDS.labels(ending[1]).inc()
        if update is not None and self.finished is not None:
            await self.finished(vm.run_id)
        return len(events)


def _step_event(w: Any, kind: str, entry: dict[str, Any]) -> NewEvent:
    step = entry.get("stepId")
    attempt = entry.get("attempt", 1)
    if not isinstance(step, str) or not 0 < len(step) <= MAX_STEP_ID:
        raise UsageError(f"stepId must be a string of 1 to {MAX_STEP_ID} characters")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise UsageError("attempt must be a positive integer")
    if kind == ev.STEP_COMPLETED:
        if "output" not in entry:
            raise UsageError("step_completed needs an output")
        output = json.loads(dumps(entry["output"]))
        return w.completed(step, attempt, output)  # type: ignore[no-any-return]
    data = entry.get("data", {"type": "step"} if kind == ev.STEP_STARTED else {})
    if not isinstance(data, dict):
        raise UsageError("data must be an object")
    if kind == ev.STEP_FAILED:
        data = {"error": _error(data.get("error"))}
    return w.event(kind, data, step_id=step, attempt=attempt)  # type: ignore[no-any-return]


def _code(entry: dict[str, Any]) -> int | None:
    code = entry.get("exitCode")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
        raise UsageError("exitCode must be an integer or null")
    return code


def _error(error: Any) -> dict[str, Any]:
    if not isinstance(error, dict):
        return {"code": ev.E_WORKLOAD_FAILED, "message": str(error), "class": "tool"}
    message = str(error.get("message", ""))[:4000]
    return {
        "code": str(error.get("code") or ev.E_WORKLOAD_FAILED),
        "message": message,
        "class": str(error.get("class") or "tool"),
        "retryable": bool(error.get("retryable", False)),
    }
