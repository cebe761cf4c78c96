"""The control plane's side of what a VM says, under its token (relayed by its runtime node):
``POST /v1/runtime/step`` (what the workload's own ``ctx.step`` did), ``POST
/v1/runtime/call`` (the steps a VM asks the control plane to perform: model calls, tools,
waits, signals among them; see ``lantern.runtime.calls``; and, for a step of its own in flight,
a claimed delivery or its live text), ``GET /v1/runtime/steps``, and ``POST
/v1/runtime/report`` (the runtime node's own: the VM's start and end).

The VM proposes, the control plane decides. Every answer comes from the run's step ledger
(``lantern.engine.ledger``, the one every kind of run asks), held in memory by the VM's
``VmDrive``: replay a journaled output, raise a journaled failure, run attempt k (its
``step_started`` journaled first), wait until a retry's journaled due time, or, for an
attempt's outcome, go on, retry (``step_retrying`` with ``dueAt``) or fail. Retry policies,
output limits and the agent's budget apply as in-process. A VM reports only the steps its own
code runs (type ``step``); anything else (a step the control plane owns, such as an approval,
a step not in flight, a ``step_*`` event) is refused (422) and writes nothing.

Everything is journaled only while the VM is the run's live VM (its row ``starting`` or
``running``: the database allows one per run), through THE fenced commit on the run lease the
node holds: a VM of a node thought lost, a VM that was replaced or cancelled, a finished one,
all get 409 and nothing is written.

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
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn, get_args

from lantern.app import App
from lantern.engine import call_args, commits, determinism, ledger
from lantern.engine import events as ev
from lantern.engine.anomalies import RetryRates
from lantern.engine.baselines import Baselines
from lantern.engine.drive import attempts
from lantern.engine.function_context import MAX_TO
from lantern.engine.function_waits import resolved
from lantern.engine.live import LiveText
from lantern.errors import (
    Conflict,
    ErrorClass,
    StepError,
    Unauthorized,
    UsageError,
)
from lantern.limits import MAX_OUTPUT_BYTES
from lantern.models import registry
from lantern.observability.metrics import delivery as count_delivery
from lantern.runtime import calls, metrics
from lantern.runtime.journal import vm_data
from lantern.runtime.vm_drive import Drives, VmDrive
from lantern.store.base import Store
from lantern.store.codec import dumps, value_problem
from lantern.store.records import Delivery, NewEvent, RunUpdate
from lantern.store.runtime import Vm

VM_KINDS = (ev.VM_STARTED, ev.VM_EXITED, ev.VM_TERMINATED)  # what a runtime node reports
STEP_FIELDS = ("stepId", "position", "attempt", "retry", "output", "error")
TOKEN_PREFIX = "lvm"
MAX_STEP_ID = 200
# Seconds between looks at a wait a VM's workload is blocked on: soon at first (a timer of a
# second, a quick decision), then at most every second for a long wait.
WAIT_POLL = (0.25, 1.0)
# The step type each call kind is journaled with: a call must match what the journal holds.
CALL_TYPES = {"model": "llm", "tool": "tool", "approval": "approval", "sleep": "sleep",
              "run_agent": "subagent", "signal": "signal"}  # fmt: skip
ERROR_CLASSES: tuple[ErrorClass, ...] = get_args(ErrorClass)
# What a VM's own step asks of the control plane while it runs, no step of its own: a claimed
# delivery (ctx.deliver_once) and its live text (ctx.live_text).
IN_STEP = ("deliver", "live")
MAX_DELIVERY_NAME = 200


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
        max_output_bytes: int = MAX_OUTPUT_BYTES,
        retry_rates: RetryRates | None = None,
        baselines: Baselines | None = None,
    ) -> None:
        self.store = store
        self.app = app or App()  # the tools ctx.tool and ctx.model's tools name
        # The model layer ctx.model calls go through: the process's, built from its settings
        # (none given: no routes, the shipped prices, no workspace budgets).
        self.models = models if models is not None else registry.Models()
        self.on_queued: Callable[[], None] = lambda: None  # a child run was queued: look now
        self.finished = finished  # issues the receipt of a run a report finished
        self.drives = Drives(
            store,
            listeners=listeners,
            patience=patience,
            max_output_bytes=max_output_bytes,
            retry_rates=retry_rates,
            baselines=baselines,
        )
        # The live text of the model steps this process runs, which GET .../stream follows:
        # a VM's ctx.live_text goes there (lantern serve gives its worker's).
        self.live: LiveText | None = None

    async def authenticate(self, authorization: str | None, *, commits: bool = False) -> Vm:
        """The VM whose token this is (401 for no token, a malformed or a wrong one), as its
        row is now. ``commits``: the request always ends in a fenced commit (an attempt's
        outcome), so a VM whose drive this control plane holds is known by its token alone,
        without reading its row again: a VM that stopped being the run's live one meanwhile
        (cancelled, replaced, lost) finds the run's journal or lease moved on, and that
        commit is refused (409) with nothing written. A ``ctx.step`` then costs three round
        trips (the row read when it asks which attempt to run, and two commits), not four."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.startswith(TOKEN_PREFIX + "."):
            raise Unauthorized("a per-VM token is required (Authorization: Bearer lvm....)")
        vm_id = token[len(TOKEN_PREFIX) + 1 :].rpartition(".")[0]
        known = self.drives.held(vm_id) if commits else None
        if known is not None and known.token_digest is not None:
            if hmac.compare_digest(known.token_digest, digest(token)):
                return known
        vm = await self.store.get_vm(vm_id) if vm_id else None
        if vm is None or vm.token_digest is None:
            raise Unauthorized("unknown VM token")
        if not hmac.compare_digest(vm.token_digest, digest(token)):
            raise Unauthorized("wrong VM token")
        return vm

    async def _live(self, vm: Vm, *, fresh: bool = False) -> VmDrive:
        """The drive of ``vm``, the run's live VM (409 otherwise). ``fresh``: ``vm`` is the
        row as this request read it; else it is read again (a wait that went on a while)."""
        current = vm if fresh else await self.store.get_vm(vm.vm_id)
        if current is None or current.state not in ("starting", "running"):
            self.drives.drop(vm.vm_id)
            state = "gone" if current is None else current.state
            raise Conflict(f"VM {vm.vm_id} is {state}: it is not the run's live VM")
        if current.lease_epoch is None:
            raise Conflict(f"VM {vm.vm_id} holds no lease on run {vm.run_id}")
        # One live VM per run (a unique index): a live row is the run's newest.
        return await self.drives.get(current)

    async def steps(self, vm: Vm) -> dict[str, Any]:
        """The run's completed steps and their outputs, in journal order."""
        drive = await self._live(vm, fresh=True)
        return {
            "runId": vm.run_id,
            "steps": [{"stepId": s, "output": o} for s, o in drive.ledger.outputs.items()],
            # Every step id in the order it was first started: what a resumed workload's
            # calls are checked against, position by position.
            "order": list(drive.ledger.order),
        }

    # -- the workload's own steps (ctx.step) ----------------------------------------------

    async def step(self, vm: Vm, body: dict[str, Any]) -> dict[str, Any]:
        """What ``ctx.step`` proposes: with no outcome, which attempt to run (``{"attempt"}``,
        ``{"dueAt", "attempt"}`` to wait for first, or the journal's ``{"output"}`` or
        ``{"error"}``); with an attempt's ``output`` or ``error``, what follows
        (``{"output"}``, ``{"retry": {"attempt", "dueAt"}}`` or ``{"error"}``)."""
        step = _step_id(body)
        policy = call_args.retry_policy(body.get("retry"), f"ctx.step({step!r})")
        outcome = _outcome(step, body)
        drive = await self._live(vm, fresh=True)
        async with drive.lock:
            book = drive.ledger
            journaled = book.types.get(step)
            if journaled is not None and journaled != "step":
                raise UsageError(
                    f"step {step!r} is journaled as a {journaled} step, which the control plane"
                    " performs: a VM reports only the steps its own code runs"
                )
            if outcome is None:
                return await self._enter(drive, step, body)
            attempt = body.get("attempt")
            entry = book.enter(step)
            if (
                isinstance(attempt, bool)
                or not isinstance(entry, ledger.Attempt)
                or entry.start
                or entry.attempt != attempt
            ):
                raise UsageError(
                    f"step {step!r} has no attempt {attempt!r} in flight: a VM reports the"
                    " outcome of the attempt the control plane told it to run"
                )
            drive.reported(step, entry.attempt, outcome[0])
            done = book.exit(step, entry.attempt, outcome[0], policy)
            await self._journal(drive, done.events)
            return _next(done.next)

    async def _enter(self, drive: VmDrive, step: str, body: dict[str, Any]) -> dict[str, Any]:
        entry = await self._entry(drive, step, body)
        if isinstance(entry, dict):
            return entry
        if isinstance(entry, ledger.Parked):
            raise UsageError(f"step {step!r} is a wait: a VM asks for it with a call")
        if isinstance(entry, ledger.Due):
            if entry.due_ms > time.time() * 1000:
                return {"dueAt": entry.due_ms, "attempt": entry.attempt}
            entry = ledger.Attempt(step, entry.attempt, entry.key, start=True)
        if entry.start:
            started = drive.ledger.start(step, entry.attempt, {"type": "step"})
            await self._journal(drive, [started])
        drive.begun(step, entry.attempt)
        return {"attempt": entry.attempt}

    async def _entry(
        self, drive: VmDrive, step: str, body: dict[str, Any]
    ) -> ledger.Attempt | ledger.Due | ledger.Parked | dict[str, Any]:
        """The ledger's answer for a step the VM enters: a replay or a journaled failure as
        the VM's answer, a nondeterministic call failing the run; else what to do."""
        position = _position(body) if drive.vm.resume else None
        entry = drive.ledger.enter(step, position)
        if isinstance(entry, ledger.Nondeterminism):
            await self.nondeterministic(drive, entry.mismatch)
        if isinstance(entry, ledger.Replay):
            return {"output": entry.output}
        if isinstance(entry, ledger.Raise):
            return {"error": dict(entry.error)}
        assert not isinstance(entry, ledger.Nondeterminism)
        return entry

    # -- the steps the control plane performs (ctx.model, ctx.tool, waits) ---------------

    async def call(self, vm: Vm, body: dict[str, Any]) -> dict[str, Any]:
        """Perform the step ``body`` asks for as a journaled step of ``vm``'s run: a model
        call or a tool (``ctx.model``, ``ctx.tool``), or a wait (``ctx.approval``,
        ``ctx.run_agent``, ``ctx.sleep``); ``{"output": ...}``, or ``{"error": ...}`` when it
        failed for good (lantern.runtime.calls)."""
        step = _step_id(body)
        request = body.get("call")
        if isinstance(request, dict) and request.get("kind") in IN_STEP:
            return await self._in_step(vm, step, request)
        if not isinstance(request, dict) or request.get("kind") not in CALL_TYPES:
            kinds = ", ".join((*CALL_TYPES, *IN_STEP))
            raise UsageError(f"call must be an object whose kind is one of {kinds}")
        drive = await self._live(vm, fresh=True)
        if request["kind"] in calls.WAITS:
            return await self._waited(drive, step, body, request)
        async with drive.lock:
            _same_type(drive, step, request)
            entry = await self._entry(drive, step, body)
            if isinstance(entry, dict):
                return entry
            book = drive.ledger
            prepared = calls.prepare(
                request,
                step=step,
                run=drive.run,
                lease=drive.lease,
                store=self.store,
                app=self.app,
                models=self.models,
                ledger=book,
            )
            if isinstance(entry, ledger.Parked):
                raise UsageError(f"step {step!r} is a wait, not a {request['kind']} call")
            due = entry.due_ms if isinstance(entry, ledger.Due) else None
            if isinstance(entry, ledger.Attempt) and entry.start:
                # Under the lock that decided it: a call sent twice starts it once.
                await self._journal(drive, [book.start(step, entry.attempt, prepared.started)])
        performed = _Performed(self, drive, step, prepared)
        done = await attempts(performed, entry.attempt, due, False)
        if done is None:  # a rate limit's wait: the VM waits for it, then asks again
            assert performed.due is not None
            return {"dueAt": performed.due[1], "attempt": performed.due[0]}
        return _next(done.next)

    # -- what a VM's own step asks for while it runs (ctx.deliver_once, ctx.live_text) -----

    async def _in_step(self, vm: Vm, step: str, request: dict[str, Any]) -> dict[str, Any]:
        """A claimed delivery of the attempt of ``step`` in flight (``deliver``) or a piece of
        its live text (``live``): each belongs to that attempt, which the VM names."""
        attempt = request.get("attempt")
        drive = await self._live(vm, fresh=True)
        async with drive.lock:
            book = drive.ledger
            entry = book.enter(step)
            if (
                isinstance(attempt, bool)
                or book.types.get(step) != "step"
                or not isinstance(entry, ledger.Attempt)
                or entry.start
                or entry.attempt != attempt
            ):
                raise UsageError(
                    f"step {step!r} has no attempt {attempt!r} in flight: a delivery or live text"
                    " belongs to the attempt of the VM's own step that runs now"
                )
        if request["kind"] == "live":
            return self._live_text(drive.run.id, step, entry.attempt, request)
        return await self._deliver(drive, step, entry, request)

    def _live_text(
        self, run_id: str, step: str, attempt: int, request: dict[str, Any]
    ) -> dict[str, Any]:
        """Pass a piece of the step's text to whoever follows the run (never journaled); say
        whether anybody does, so a workload nobody watches need not stream."""
        live, text = self.live, request.get("text", "")
        if not isinstance(text, str):
            raise UsageError("live text is a string")
        if live is None:
            return {"following": False}
        if request.get("done") is True:
            live.finished(run_id, step, attempt)
            return {"following": False}
        live.append(run_id, step, attempt, text)
        return {"following": live.listening(run_id)}

    async def _deliver(
        self, drive: VmDrive, step: str, entry: ledger.Attempt, request: dict[str, Any]
    ) -> dict[str, Any]:
        """``claim``: claim the delivery before the VM dispatches it (a delivered one answers
        its recorded response: the VM dispatches nothing); ``finish``: record what the VM's
        dispatch did (``output``, or ``error``). Fenced by the run lease the node holds."""
        name, to, phase = request.get("name"), request.get("to"), request.get("phase")
        if not isinstance(name, str) or not 0 < len(name) <= MAX_DELIVERY_NAME:
            raise UsageError(
                f"a delivery's name is a string of 1 to {MAX_DELIVERY_NAME} characters"
            )
        if to is not None and (not isinstance(to, str) or not 0 < len(to) <= MAX_TO):
            raise UsageError(
                f"ctx.deliver_once({name!r}, to=...): where it goes is a string of 1 to"
                f" {MAX_TO} characters"
            )
        if phase not in ("claim", "finish"):
            raise UsageError("a delivery's phase is 'claim' or 'finish'")
        claim = Delivery(
            run_id=drive.run.id,
            step_id=step,
            name=name,
            attempt=entry.attempt,
            idempotency_key=entry.key,
            kind="code",
            target=to,
        )
        receipt = await self.store.claim_delivery(drive.lease, claim)
        if receipt.status == "delivered":
            if phase == "claim":
                count_delivery("code", "replayed")
            return {"delivered": True, "response": receipt.response}
        if phase == "claim":
            return {"delivered": False}
        if "error" in request:
            error = request["error"]
            message = error.get("message") if isinstance(error, dict) else None
            failed = {"message": message if isinstance(message, str) else "the delivery failed"}
            await self.store.finish_delivery(drive.lease, receipt, "failed", failed)
            count_delivery("code", "failed")
            return {"delivered": False}
        answer = request.get("output")
        problem = value_problem(answer)
        if problem is not None:  # it went out; what came back cannot be kept
            await self.store.finish_delivery(drive.lease, receipt, "delivered", None)
            count_delivery("code", "unstorable")
            raise UsageError(f"delivery {name!r}: its answer cannot be stored: {problem}")
        await self.store.finish_delivery(drive.lease, receipt, "delivered", answer)
        count_delivery("code", "delivered")
        return {"delivered": True, "response": answer}

    async def _waited(
        self, drive: VmDrive, step: str, body: dict[str, Any], request: dict[str, Any]
    ) -> dict[str, Any]:
        """Journal a wait's start as an in-process code agent does (``step_started``, then
        ``step_waiting``), or find it journaled; then wait (the VM waits with it) until it
        resolves."""
        async with drive.lock:
            _same_type(drive, step, request)
            entry = await self._entry(drive, step, body)
            if isinstance(entry, dict):
                return entry
            wait = calls.prepare_wait(
                request, run=drive.run, store=self.store, app=self.app, on_queued=self.on_queued
            )
            book = drive.ledger
            if isinstance(entry, ledger.Parked):  # the VM that started the wait was lost
                attempt, data = entry.attempt, entry.wait
            else:
                attempt = entry.attempt  # a wait is never retried: it has no due time
                if isinstance(entry, ledger.Due) or entry.start:
                    await self._journal(drive, [book.start(step, attempt, wait.started)])
                try:
                    data = await wait.make(step, attempt)
                except StepError as exc:
                    await self._journal(drive, [book.failed(step, attempt, exc)])
                    return {"error": exc.to_json()}
                await self._journal(drive, [book.wait(step, attempt, data)])
        return await self._resolve(drive, step, data)

    async def _resolve(self, drive: VmDrive, step: str, wait: dict[str, Any]) -> dict[str, Any]:
        """Wait until the wait resolves, as an in-process one would (a decision, a signal,
        the child run's end, the due time), then journal ``step_resumed`` and the step's output or
        failure. A VM that stops being the run's live one ends it (409)."""
        every = WAIT_POLL[0]
        vm = drive.vm
        while True:
            # Looked at and journaled under the drive's lock: the ledger that decides which
            # signal a wait takes is the one the commit folds it into.
            async with drive.lock:
                found = await resolved(self.store, drive.ledger, step, wait)
                if found is not None:
                    done = drive.ledger.resumed(step, *found)
                    await self._journal(drive, done.events)
                    return _next(done.next)
            due = wait.get("dueAt")
            left = every if due is None else max(0.0, min(every, due / 1000 - time.time()))
            await asyncio.sleep(left)
            every = min(every * 1.5, WAIT_POLL[1])
            drive = await self._live(vm)  # Conflict once the VM is lost, replaced, cancelled

    # -- the runtime node's own reports --------------------------------------------------

    async def report(self, vm: Vm, entries: list[Any]) -> int:
        """Journal a batch of the runtime node's reports of ``vm`` (its start, its end); the
        number of events written."""
        if not isinstance(entries, list) or not entries:
            raise UsageError("events must be a non-empty list")
        drive = await self._live(vm, fresh=True)
        async with drive.lock:
            return await self._report(drive, entries)

    async def _report(self, drive: VmDrive, entries: list[Any]) -> int:
        vm = drive.vm
        for entry in entries:
            kind = entry.get("kind") if isinstance(entry, dict) else None
            if kind not in VM_KINDS:
                raise UsageError(
                    f"a report's kind must be one of {', '.join(VM_KINDS)}: a VM proposes its"
                    " own steps through POST /v1/runtime/step, and asks for any other step"
                    " through POST /v1/runtime/call"
                )
        if any(e["kind"] != ev.VM_STARTED for e in entries[:-1]):
            raise UsageError("nothing may follow the report of a VM's end")
        ending, update, made = self._ending(drive, entries)
        book = drive.ledger
        if update is not None and update.status == "succeeded" and vm.resume:
            # A resumed workload that returned before asking for every step the journal holds.
            calls_made = entries[-1]["outcome"].get("calls")
            if isinstance(calls_made, int):
                found = determinism.unfinished(book.order, calls_made)
                if found is not None:
                    await self.nondeterministic(drive, found)
        events: list[NewEvent] = []
        try:
            for entry in entries:
                if entry["kind"] == ev.VM_STARTED:
                    warm = {"warm": True} if entry.get("warm") is True else {}  # booted ahead
                    events.append(book.event(ev.VM_STARTED, vm_data(vm, driver=vm.driver, **warm)))
            events += made(book)
        except BaseException:
            self.drives.drop(vm.vm_id)  # its ledger counts events never committed
            raise
        await self.drives.commit(drive, events, update)
        if any(e.kind == ev.VM_STARTED for e in events) and await self.store.set_vm_running(
            vm.vm_id
        ):
            placed = (datetime.now(UTC) - vm.created_at).total_seconds()
            metrics.VM_START.labels(vm.driver).observe(placed)
        if ending is not None:
            self.drives.drop(vm.vm_id)
            await self.store.end_vm(vm.vm_id, ending[0], ending[1], ending[2])  # type: ignore[arg-type]
            metrics.VM_ENDS.labels(ending[1]).inc()
        if update is not None and self.finished is not None:
            await self.finished(vm.run_id)
        return len(events)

    def _ending(
        self, drive: VmDrive, entries: list[dict[str, Any]]
    ) -> tuple[
        tuple[str, str, int | None] | None,
        RunUpdate | None,
        Callable[[ledger.Ledger], list[NewEvent]],
    ]:
        """A report's last entry when it ends the VM, checked before any event is made: the
        VM row's end (state, reason, exit code), the run's update, and its events."""
        vm = drive.vm
        last = entries[-1]
        kind = last["kind"]
        if kind == ev.VM_EXITED:
            code = _code(last)
            outcome = last.get("outcome")
            if not isinstance(outcome, dict) or not ("output" in outcome or "error" in outcome):
                raise UsageError("vm_exited needs an outcome with output or error")
            exited = vm_data(vm, exitCode=code, reason="exited")
            if "error" in outcome:
                error = _error(outcome["error"])

                def failed(book: ledger.Ledger) -> list[NewEvent]:
                    return [book.event(ev.VM_EXITED, exited), book.run_failed(error)[0]]

                return ("exited", "exited", code), RunUpdate("failed", error=error), failed
            output = json.loads(dumps(outcome["output"]))

            def succeeded(book: ledger.Ledger) -> list[NewEvent]:
                return [book.event(ev.VM_EXITED, exited), book.succeeded(output)[0]]

            return ("exited", "exited", code), RunUpdate("succeeded", output=output), succeeded
        if kind == ev.VM_TERMINATED:
            reason = last.get("reason")
            if reason not in ("timeout", "killed"):
                raise UsageError("vm_terminated reason must be timeout or killed")
            code = _code(last)
            data = vm_data(vm, exitCode=code, reason=reason)
            if reason == "timeout":
                message = str(last.get("message") or "the workload ran past timeoutS")
                error = ev.run_error(ev.E_TIMEOUT, message, retryable=False)
                error["class"] = "timeout"

                def timed_out(book: ledger.Ledger) -> list[NewEvent]:
                    return [book.event(ev.VM_TERMINATED, data), book.run_failed(error)[0]]

                return ("terminated", reason, code), RunUpdate("failed", error=error), timed_out

            def killed(book: ledger.Ledger) -> list[NewEvent]:
                return [book.event(ev.VM_TERMINATED, data)]

            return ("terminated", str(reason), code), None, killed
        return None, None, lambda book: []

    async def nondeterministic(self, drive: VmDrive, found: determinism.Mismatch) -> NoReturn:
        """A resumed VM's workload asked for other steps than the journal holds: the run
        fails with ``nondeterminism`` and the VM is stopped (the 409 tells its node)."""
        await self._stop(drive, [], found.error(), determinism.NONDETERMINISM)

    async def _journal(self, drive: VmDrive, events: list[NewEvent]) -> None:
        """Commit step events of ``drive``'s run with the anomalies they raise (as every
        kind of run's are); one whose policy fails the run stops the VM (409)."""
        error = await drive.notice(events)
        if error is None:
            await self.drives.commit(drive, events)
            return
        await self._stop(drive, events, error, ev.E_ANOMALY)

    async def _stop(
        self, drive: VmDrive, events: list[NewEvent], error: dict[str, Any], reason: str
    ) -> NoReturn:
        """Fail the run with ``error`` after ``events`` and stop its VM (state ``terminated``,
        ``reason``): the 409 this raises tells the VM's runtime node to stop it."""
        vm = drive.vm
        book = drive.ledger
        data = vm_data(vm, exitCode=None, reason=reason)
        ended = [*events, book.event(ev.VM_TERMINATED, data)]
        failed, update = book.run_failed(error)
        await self.drives.commit(drive, [*ended, failed], update)
        self.drives.drop(vm.vm_id)
        if await self.store.end_vm(vm.vm_id, "terminated", reason, None):
            metrics.VM_ENDS.labels(reason).inc()
        if self.finished is not None:
            await self.finished(vm.run_id)
        raise Conflict(f"run {vm.run_id} failed: {error['message']}")


def _next(found: ledger.Next) -> dict[str, Any]:
    """The VM's answer for what follows a step: go on, retry, or fail."""
    if isinstance(found, ledger.Completed):
        return {"output": found.output}
    if isinstance(found, ledger.Retry):
        return {"retry": {"attempt": found.attempt, "dueAt": found.due_ms}}
    return {"error": found.error.to_json()}


def _same_type(drive: VmDrive, step: str, request: dict[str, Any]) -> None:
    """A call for a step the journal holds as another type (a step the VM ran itself, say,
    under the name of an approval) is refused: its journaled outcome is not this call's."""
    journaled = drive.ledger.types.get(step)
    wanted = CALL_TYPES[request["kind"]]
    if journaled is not None and journaled != wanted:
        raise UsageError(
            f"step {step!r} is journaled as a {journaled} step, not {request['kind']!r}:"
            " each step name is one kind of step"
        )


class _Performed:
    """How a step the control plane performs for a VM journals its attempts
    (``drive.attempts``): each event committed at once, under the drive's lock; the VM's
    request waits out a retry's backoff. A rate limit's wait that parks (``ledger.parks``)
    is the VM's to wait: the call answers ``{"dueAt", "attempt"}`` (``due``) and the VM asks
    again then, so no request, no channel and no replica's run slot is held meanwhile."""

    __slots__ = ("drive", "due", "prepared", "relay", "step")

    def __init__(self, relay: Relay, drive: VmDrive, step: str, prepared: calls.Prepared) -> None:
        self.relay, self.drive, self.step, self.prepared = relay, drive, step, prepared
        self.due: tuple[int, int] | None = None  # (attempt, due epoch ms): the VM waits

    async def backoff(self, due_ms: int) -> bool:
        book = self.drive.ledger
        if book.parks(self.step, due_ms):
            self.due = (book.state.throttled[self.step][0], due_ms)
            return False
        await asyncio.sleep(max(0.0, due_ms / 1000 - time.time()))
        return True

    async def ready(self, attempt: int, start: bool) -> None:
        if start:
            drive = self.drive
            async with drive.lock:
                started = drive.ledger.start(self.step, attempt, self.prepared.started)
                await self.relay._journal(drive, [started])

    async def attempt(self, attempt: int) -> Any:
        """One attempt, as every drive performs one (its span, its duration, its model
        usage): its output, or the StepError it failed with."""
        drive, prepared = self.drive, self.prepared
        work = prepared.work(attempt, drive.ledger.key(self.step, attempt))
        try:
            return await drive.perform(self.step, attempt, prepared.step_type, work)
        except StepError as exc:
            return exc

    async def settled(self, attempt: int, outcome: Any) -> ledger.Exit:
        drive, prepared = self.drive, self.prepared
        async with drive.lock:
            done = drive.ledger.exit(
                self.step, attempt, outcome, prepared.policy, usage=prepared.usage
            )
            await self.relay._journal(drive, done.events)
        return done


def _step_id(body: dict[str, Any]) -> str:
    step = body.get("stepId")
    if not isinstance(step, str) or not 0 < len(step) <= MAX_STEP_ID:
        raise UsageError(f"stepId must be a string of 1 to {MAX_STEP_ID} characters")
    return step


def _position(entry: dict[str, Any]) -> int:
    """The 1-based position of a step's call in its workload, as the harness counted it."""
    position = entry.get("position")
    if isinstance(position, bool) or not isinstance(position, int) or position < 1:
        raise UsageError("a resumed VM's step needs its position, an integer >= 1")
    return position


def _outcome(step: str, body: dict[str, Any]) -> tuple[Any] | None:
    """What an attempt of a VM's own step did, as the ledger takes it: its output, or a
    StepError made of the error it proposes (None: the VM asks which attempt to run)."""
    if "output" in body and "error" in body:
        raise UsageError("a step's outcome is an output or an error, not both")
    if "output" in body:
        return (body["output"],)
    if "error" not in body:
        return None
    error = body["error"]
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        raise UsageError("a step's error is {message, class, retryable}")
    found = error.get("class", "tool")
    if found not in ERROR_CLASSES:
        raise UsageError(f"a step's error class is one of {', '.join(ERROR_CLASSES)}")
    retryable = error.get("retryable", False)
    if not isinstance(retryable, bool):
        raise UsageError("a step's error retryable is true or false")
    message = error["message"][:4000]
    return (StepError(message, error_class=found, retryable=retryable),)


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
