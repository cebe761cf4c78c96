"""The control plane's side of ``POST /v1/runtime/report``, ``GET /v1/runtime/steps`` and
``POST /v1/runtime/call`` (the steps a VM asks the control plane to perform: model calls,
tools, waits; see ``lantern.runtime.calls``).

A runtime node relays what its VM reported, under the VM's token. A report is journaled only
when the VM is the run's live VM (its row is ``starting`` or ``running`` and it is the run's
newest), and then through THE fenced commit every drive uses (``lantern.engine.commits``), on
the run lease the node holds: a VM of a node thought lost, a VM that was replaced, a finished
one, all get 409 and nothing is written.

A resumed VM (``LANTERN_RESUME=1``) runs its workload again from the top, so its step names
are checked against the journal's order as a re-drive of an in-process code agent's are
(``lantern.engine.determinism``): the harness sends each call's position, and a different
name at a journaled position fails the run with ``nondeterminism`` (the VM is stopped: 409),
as does a workload that returns before asking for every step the journal holds.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime
from typing import Any

from lantern.app import App
from lantern.engine import call_args, commits, determinism
from lantern.engine import events as ev
from lantern.engine.drive import observed
from lantern.engine.function_waits import resolved
from lantern.engine.graph import parse_agent
from lantern.engine.journal import EventWriter, RunState, fold
from lantern.engine.microvm import MicroVmAgent
from lantern.errors import (
    Conflict,
    DefinitionError,
    LanternError,
    LeaseLost,
    StepError,
    Unauthorized,
    UsageError,
)
from lantern.ids import idempotency_key
from lantern.models import registry
from lantern.runtime import calls, metrics
from lantern.runtime.journal import vm_data, writer
from lantern.store.base import Store
from lantern.store.codec import dumps, text_problem
from lantern.store.records import Append, Event, Lease, NewEvent, Run, RunUpdate
from lantern.store.runtime import Vm

STEP_KINDS = (ev.STEP_STARTED, ev.STEP_COMPLETED, ev.STEP_FAILED, ev.STEP_RETRYING)
TOKEN_PREFIX = "lvm"
MAX_STEP_ID = 200
MAX_ORDERS = 1000  # resumed VMs whose journaled step order is kept in memory
# Seconds between looks at a wait a VM's workload is blocked on: soon at first (a timer of a
# second, a quick decision), then at most every second for a long wait.
WAIT_POLL = (0.25, 1.0)


def new_token(vm_id: str, secret: str) -> str:
    return f"{TOKEN_PREFIX}.{vm_id}.{secret}"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Relay:
    def __init__(
        self,
        store: Store,
        *,
        listeners: Sequence[commits.Listener] = (),
        finished: Callable[[str], Awaitable[None]] | None = None,
        patience: float = 60.0,
        app: App | None = None,
        models: registry.Models | None = None,
    ) -> None:
        self.store = store
        self.app = app or App()  # the tools ctx.tool and ctx.model's tools name
        # The model layer ctx.model calls go through: the process's, built from its settings
        # (none given: no routes, the shipped prices, no workspace budgets).
        self.models = models if models is not None else registry.Models()
        self.on_queued: Callable[[], None] = lambda: None  # a child run was queued: look now
        self.listeners = listeners
        self.finished = finished  # issues the receipt of a run a report finished
        self.patience = patience  # how long a commit is sent again across a database blink
        self._locks: dict[str, asyncio.Lock] = {}
        self._orders: OrderedDict[str, list[str]] = OrderedDict()  # vm id -> order()
        self._budgets: OrderedDict[tuple[str, str, int], Mapping[str, Any] | None] = OrderedDict()

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
            # Every step id in the order it was first started: what a resumed workload's
            # calls are checked against, position by position.
            "order": list(state.attempts),
        }

    async def call(self, vm: Vm, body: dict[str, Any]) -> dict[str, Any]:
        """Perform the step ``body`` asks for as a journaled step of ``vm``'s run: a model
        call or a tool (``ctx.model``, ``ctx.tool``), or a wait (``ctx.approval``,
        ``ctx.run_agent``, ``ctx.sleep``); ``{"output": ...}``, or ``{"error": ...}`` when it
        failed for good (lantern.runtime.calls)."""
        step = body.get("stepId")
        if not isinstance(step, str) or not 0 < len(step) <= MAX_STEP_ID:
            raise UsageError(f"stepId must be a string of 1 to {MAX_STEP_ID} characters")
        request = body.get("call")
        if isinstance(request, dict) and request.get("kind") in calls.WAITS:
            return await self._waited(vm, step, body, request)
        async with self._run_lock(vm.run_id):
            opened = await self._opening(vm, step, body)
            if isinstance(opened, dict):
                return opened
            vm, run, journal, state = opened
            types = {
                e.step_id: str(e.data.get("type", "step"))
                for e in journal
                if e.kind == ev.STEP_STARTED and e.step_id
            }
            assert vm.lease_epoch is not None
            lease = Lease(vm.run_id, vm.node_id, vm.lease_epoch)
            prepared = calls.prepare(
                request,
                step=step,
                run=run,
                lease=lease,
                store=self.store,
                app=self.app,
                models=self.models,
                spent=lambda: call_args.model_spent(state.outputs, types),
                budget=await self._budget(run),
            )
            due: int | None = None
            if step in state.retrying:  # a backoff the VM's loss cut short
                attempt, due = state.retrying[step]
            elif step in state.attempts:  # in flight when the VM was lost: same attempt, key
                attempt = state.attempts[step]
            else:
                attempt = 1
                await self._step(vm, ev.STEP_STARTED, step, attempt, prepared.started, held=True)
        while True:
            if due is not None:
                await asyncio.sleep(max(0.0, due / 1000 - time.time()))
                due = None
                await self._step(vm, ev.STEP_STARTED, step, attempt, prepared.started)
            outcome = await _attempt(prepared, run.id, step, attempt)
            if not isinstance(outcome, StepError):
                text = dumps(outcome)
                problem = text_problem(text)
                if problem is None:
                    output = json.loads(text)
                    usage = prepared.usage(output)
                    async with self._run_lock(vm.run_id):
                        live = await self._live(vm)
                        w = await writer(self.store, vm.run_id)
                        event = w.completed(step, attempt, output, text, usage=usage)
                        await self.commit(live, [event], None)
                    return {"output": output}
                outcome = StepError(
                    f"step {step!r} returned a value the journal cannot store: {problem}",
                    error_class="tool",
                )
            if prepared.policy.retries(outcome, attempt):
                delay = prepared.policy.delay_ms(attempt)
                due = int(time.time() * 1000) + delay
                data = {
                    "attempt": attempt + 1,
                    "of": prepared.policy.max_attempts,
                    "error": outcome.to_json(),
                    "delayMs": delay,
                    "dueAt": due,
                }
                attempt += 1
                await self._step(vm, ev.STEP_RETRYING, step, attempt, data)
                continue
            error = outcome.to_json()
            await self._step(vm, ev.STEP_FAILED, step, attempt, {"error": error})
            return {"error": error}

    async def _budget(self, run: Run) -> Mapping[str, Any] | None:
        """The budget of the run's agent version (a version never changes: kept in memory)."""
        key = (run.workspace, run.agent_name, run.agent_version)
        if key not in self._budgets:
            found = await self.store.get_agent(*key)
            agent = None
            if found is not None:
                with suppress(DefinitionError):
                    agent = parse_agent(found.definition)
            budget = agent.budget if isinstance(agent, MicroVmAgent) else None
            self._budgets[key] = budget
            while len(self._budgets) > MAX_ORDERS:
                self._budgets.popitem(last=False)
        return self._budgets[key]

    async def _opening(
        self, vm: Vm, step: str, body: dict[str, Any]
    ) -> tuple[Vm, Run, list[Event], RunState] | dict[str, Any]:
        """What every call checks first, holding the run's lock: the VM is the run's live
        one, a resumed VM's call is where the journal has it (else ``nondeterminism``), and a
        step the journal has finished is answered from it."""
        vm = await self._live(vm)
        run = await self.store.get_run(vm.run_id)
        if run is None:
            raise Conflict(f"run {vm.run_id} is gone")
        journal = await self.store.events(vm.run_id, blobs=True)
        state = fold(journal)
        if vm.resume:
            found = determinism.mismatch(list(state.attempts), _position(body), step)
            if found is not None:
                await self.nondeterministic(vm, found)
        if step in state.outputs:  # it completed before this VM asked: the journal's
            return {"output": state.outputs[step]}
        if step in state.failed:  # failed for good before: the same answer again
            failed = [e for e in journal if e.kind == ev.STEP_FAILED and e.step_id == step]
            return {"error": dict(failed[-1].data.get("error") or {})}
        return vm, run, journal, state

    async def _waited(
        self, vm: Vm, step: str, body: dict[str, Any], request: dict[str, Any]
    ) -> dict[str, Any]:
        async with self._run_lock(vm.run_id):
            opened = await self._opening(vm, step, body)
            if isinstance(opened, dict):
                return opened
            vm, run, _, state = opened
            started = await self._open_wait(vm, run, step, state, request)
            if isinstance(started, dict):
                return started  # it failed at once (a sub-agent that cannot start)
        return await self._resolve(vm, step, *started)

    async def _open_wait(
        self, vm: Vm, run: Run, step: str, state: RunState, request: dict[str, Any]
    ) -> tuple[int, dict[str, Any]] | dict[str, Any]:
        """Journal a wait's start as an in-process code agent does (``step_started``, then
        ``step_waiting``), or find it journaled: its attempt and wait data, or the step's
        error when it failed at once. Called holding the run's lock."""
        wait = calls.prepare_wait(
            request, run=run, store=self.store, app=self.app, on_queued=self.on_queued
        )
        found = state.waiting.get(step)
        attempt = state.attempts.get(step)
        if found is not None and attempt is not None:
            return attempt, found  # the VM that started the wait was lost: wait on
        if attempt is None:
            attempt = 1
            await self._step(vm, ev.STEP_STARTED, step, attempt, wait.started, held=True)
        try:
            data = await wait.make(step, attempt)
        except StepError as exc:
            error = exc.to_json()
            await self._step(vm, ev.STEP_FAILED, step, attempt, {"error": error}, held=True)
            return {"error": error}
        await self._step(vm, ev.STEP_WAITING, step, attempt, data, held=True)
        return attempt, data

    async def _resolve(
        self, vm: Vm, step: str, attempt: int, wait: dict[str, Any]
    ) -> dict[str, Any]:
        """Wait (the VM waits with it) until the wait resolves, as an in-process one would
        (a decision, the child run's end, the due time), then journal ``step_resumed`` and
        the step's output or failure. A VM that stops being the run's live one ends it."""
        every = WAIT_POLL[0]
        while (found := await resolved(self.store, vm.run_id, step, wait)) is None:
            await self._live(vm)  # Conflict once the VM is lost or replaced
            due = wait.get("dueAt")
            left = every if due is None else max(0.0, min(every, due / 1000 - time.time()))
            await asyncio.sleep(left)
            every = min(every * 1.5, WAIT_POLL[1])
        data, outcome = found
        async with self._run_lock(vm.run_id):
            live = await self._live(vm)
            w = await writer(self.store, vm.run_id)
            events = [w.event(ev.STEP_RESUMED, data, step_id=step, attempt=attempt)]
            if isinstance(outcome, StepError):
                error = outcome.to_json()
                failed = w.event(ev.STEP_FAILED, {"error": error}, step_id=step, attempt=attempt)
                events.append(failed)
                await self.commit(live, events, None)
                return {"error": error}
            output = json.loads(dumps(outcome))
            events.append(w.completed(step, attempt, output))
            await self.commit(live, events, None)
            return {"output": output}

    async def _step(
        self,
        vm: Vm,
        kind: str,
        step: str,
        attempt: int,
        data: dict[str, Any],
        held: bool = False,
    ) -> None:
        """One event of a step the control plane performs for ``vm``, committed while the
        VM is still the run's live one (``held``: the caller holds the run's lock)."""
        if not held:
            async with self._run_lock(vm.run_id):
                await self._step(vm, kind, step, attempt, data, held=True)
            return
        live = await self._live(vm)
        w = await writer(self.store, vm.run_id)
        await self.commit(live, [w.event(kind, data, step_id=step, attempt=attempt)], None)

    async def order(self, vm: Vm) -> list[str] | None:
        """The journal's step order, which a resumed VM's calls must follow (None for a
        first VM: nothing it asks for was journaled before it)."""
        if not vm.resume:
            return None
        found = self._orders.get(vm.vm_id)
        if found is None:
            # Read once per VM: what its predecessors journaled cannot change any more (their
            # reports are refused), and the steps this VM adds come after it.
            found = list(fold(await self.store.events(vm.run_id)).attempts)
            self._orders[vm.vm_id] = found
            while len(self._orders) > MAX_ORDERS:
                self._orders.popitem(last=False)
        return found

    async def report(self, vm: Vm, entries: list[Any]) -> int:
        """Journal a batch of reports from ``vm``; the number of events written."""
        if not isinstance(entries, list) or not entries:
            raise UsageError("events must be a non-empty list")
        async with self._run_lock(vm.run_id):
            return await self._report(vm, entries)

    @asynccontextmanager
    async def _run_lock(self, run_id: str) -> AsyncIterator[None]:
        """One report or call of a run at a time, in this process."""
        lock = self._locks.setdefault(run_id, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked():  # nobody else waits on it: forget it
                self._locks.pop(run_id, None)

    async def _report(self, vm: Vm, entries: list[Any]) -> int:
        vm = await self._live(vm)
        w = await writer(self.store, vm.run_id)
        events: list[NewEvent] = []
        update: RunUpdate | None = None
        ending: tuple[str, str, int | None] | None = None  # state, reason, exit code
        order = await self.order(vm)
        for entry in entries:
            if ending is not None:
                raise UsageError("nothing may follow the report of a VM's end")
            kind = entry.get("kind") if isinstance(entry, dict) else None
            if kind in STEP_KINDS:
                event = _step_event(w, kind, entry)
                if kind == ev.STEP_STARTED and order is not None:
                    found = determinism.mismatch(order, _position(entry), str(event.step_id))
                    if found is not None:
                        await self.nondeterministic(vm, found)
                events.append(event)
            elif kind == ev.VM_STARTED:
                warm = {"warm": True} if entry.get("warm") is True else {}  # booted ahead
                events.append(w.event(ev.VM_STARTED, vm_data(vm, driver=vm.driver, **warm)))
            elif kind == ev.VM_EXITED:
                code = _code(entry)
                outcome = entry.get("outcome")
                if not isinstance(outcome, dict) or not ("output" in outcome or "error" in outcome):
                    raise UsageError("vm_exited needs an outcome with output or error")
                events.append(w.event(ev.VM_EXITED, vm_data(vm, exitCode=code, reason="exited")))
                calls = outcome.get("calls")
                if order is not None and "error" not in outcome and isinstance(calls, int):
                    found = determinism.unfinished(order, calls)
                    if found is not None:
                        await self.nondeterministic(vm, found)
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
        await self.commit(vm, events, update)
        if any(e.kind == ev.VM_STARTED for e in events) and await self.store.set_vm_running(
            vm.vm_id
        ):
            placed = (datetime.now(UTC) - vm.created_at).total_seconds()
            metrics.VM_START.labels(vm.driver).observe(placed)
        if ending is not None:
            self._orders.pop(vm.vm_id, None)
            await self.store.end_vm(vm.vm_id, ending[0], ending[1], ending[2])  # type: ignore[arg-type]
            metrics.VM_ENDS.labels(ending[1]).inc()
        if update is not None and self.finished is not None:
            await self.finished(vm.run_id)
        return len(events)

    async def commit(self, vm: Vm, events: Sequence[NewEvent], update: RunUpdate | None) -> None:
        """THE fenced commit (``lantern.engine.commits``) on the run lease of ``vm``'s runtime
        node; 409 when that lease is no longer current."""
        assert vm.lease_epoch is not None
        lease = Lease(vm.run_id, vm.node_id, vm.lease_epoch)
        # The run's log lines name its agent: read it for the commits that start or end it.
        run = await self.store.get_run(vm.run_id) if update is not None else None
        try:
            await commits.commit(
                self.store,
                Append(lease, tuple(events), update),
                patience=self.patience,
                listeners=self.listeners,
                run=run,
            )
        except LeaseLost as exc:
            raise Conflict(f"VM {vm.vm_id} no longer holds run {vm.run_id}: {exc}") from exc

    async def nondeterministic(self, vm: Vm, found: determinism.Mismatch) -> None:
        """A resumed VM's workload asked for other steps than the journal holds: the run
        fails with ``nondeterminism`` and the VM is stopped (the 409 tells its node)."""
        error = found.error()
        w: EventWriter = await writer(self.store, vm.run_id)
        data = vm_data(vm, exitCode=None, reason=determinism.NONDETERMINISM)
        events = [w.event(ev.VM_TERMINATED, data), w.event(ev.RUN_FAILED, {"error": error})]
        await self.commit(vm, events, RunUpdate("failed", error=error))
        self._orders.pop(vm.vm_id, None)
        if await self.store.end_vm(vm.vm_id, "terminated", determinism.NONDETERMINISM, None):
            metrics.VM_ENDS.labels(determinism.NONDETERMINISM).inc()
        if self.finished is not None:
            await self.finished(vm.run_id)
        raise Conflict(f"run {vm.run_id} failed: {error['message']}")


async def _attempt(prepared: calls.Prepared, run_id: str, step: str, attempt: int) -> Any:
    """One attempt of a step performed for a VM, observed as every drive's steps are (its
    span, its duration, its model usage): its output, or the StepError it failed with."""
    key = idempotency_key(run_id, step, attempt)
    try:
        return await observed(
            prepared.work(attempt, key), run_id, step, prepared.step_type, attempt, key
        )
    except StepError as exc:
        return exc
    except LanternError:
        raise  # a lost lease, a store failure: not the step's
    except Exception as exc:  # the tool raised: retryable, as in-process
        message = " ".join(f"{type(exc).__name__}: {exc}".split())
        return StepError(message, error_class="tool", retryable=True)


def _position(entry: dict[str, Any]) -> int:
    """The 1-based position of a step's call in its workload, as the harness counted it."""
    position = entry.get("position")
    if isinstance(position, bool) or not isinstance(position, int) or position < 1:
        raise UsageError("a resumed VM's step_started needs its position, an integer >= 1")
    return position


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
    found = {
        "code": str(error.get("code") or ev.E_WORKLOAD_FAILED)[:100],
        "message": message,
        "class": str(error.get("class") or "tool")[:100],
        "retryable": bool(error.get("retryable", False)),
    }
    step = error.get("step")
    if isinstance(step, str) and 0 < len(step) <= MAX_STEP_ID:
        found["step"] = step  # the step whose failure ended the run
    return found
