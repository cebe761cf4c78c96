"""Drives a code-first agent: the user's function runs, and every ``ctx`` call is a step.

The journal discipline is the runner's. A step's ``step_started`` is committed before its
function is invoked; its ``step_completed`` is committed with whatever the code asks for next
(the next ``step_started``, or the run's end), or on the next turn of the event loop when the
code goes on with something else, so a step costs one commit, as a graph's does. Commits are
grouped: the starts of 32 concurrent steps go out in one or two transactions.

A re-drive runs the function again from the top. Each call gets its step id (``name``,
``name#2``, ...) and must ask for the step the journal holds at that position
(``determinism``); a completed step returns its journaled output without being invoked; a
failed one raises its journaled error; the one in flight at the crash runs again with the
attempt it started with, so with the same idempotency key; a retry waiting out its backoff
waits until the journaled due time.

``sleep``, ``approval`` and ``run_agent`` park: their wait is journaled (``step_waiting``
with a due time, an approval, a child run), the steps still running finish, the function is
stopped, and the run gives its lease up in the commit that sets it ``waiting`` (with
``wake_at`` for a timer). No task and no lease is held while it is parked: the dispatcher of
any replica claims it when it is due or decided, and the replay brings the function back to
the parked call, which now returns.

A replica whose App does not have the run's pinned version leaves the run: it journals
``run_parked`` and sets the run waiting for that version; a replica that has it adopts it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from lantern.app import CodeAgent
from lantern.engine import code_input, determinism
from lantern.engine import events as ev
from lantern.engine.anomalies import Detector, settings, signature
from lantern.engine.code_agents import RUN_PARKED, CodeSpec, pinned_version
from lantern.engine.journal import EventWriter, RunState, count_committed, fold, recovery
from lantern.errors import LeaseLost, StepError, UsageError
from lantern.observability import metrics
from lantern.store.codec import dumps, text_problem
from lantern.store.records import TERMINAL, Append, Event, Lease, NewEvent, Run, RunUpdate

if TYPE_CHECKING:
    from lantern.engine.runner import Runner

log = logging.getLogger("lantern.functions")

FUNCTION_ERROR = "function_error"
INVALID_INPUT = "invalid_input"
INVALID_OUTPUT = "invalid_output"


class FailedStep(StepError):
    """A step that failed for good, raised into the function: catch it to go on without it."""

    def __init__(self, step: str, error: dict[str, Any]) -> None:
        super().__init__(
            str(error.get("message", "the step failed")),
            error_class=error.get("class", "tool"),
            retryable=bool(error.get("retryable", False)),
        )
        self.step = step
        self.error = error


class FunctionDrive:
    """One drive of one code-first run (the runner's counterpart of a graph drive)."""

    def __init__(self, runner: Runner, run: Run, spec: CodeSpec) -> None:
        self.r = runner
        self.run = run
        self.spec = spec
        self.agent: CodeAgent | None = runner.app.agents.get(run.agent_name)
        self.lease = Lease(run.id, runner.worker_id, 0)
        self.writer = EventWriter(run.id)
        self.final: RunUpdate | None = None
        self.cancelled = asyncio.Event()
        if run.cancel_requested:
            self.cancelled.set()
        # What the journal holds (and, as the drive goes on, what it has added).
        self.order: list[str] = []  # step ids in the order they were first started
        self.outputs: dict[str, Any] = {}
        self.errors: dict[str, dict[str, Any]] = {}
        self.attempts: dict[str, int] = {}
        self.retrying: dict[str, tuple[int, int]] = {}
        self.waiting: dict[str, dict[str, Any]] = {}
        self.model_steps: set[str] = set()  # for the budget: what model steps have spent
        self.names = determinism.StepNames()
        # Commits: events wait in ``pending`` until a caller needs them durable.
        self.pending: list[NewEvent] = []
        self._flushing: asyncio.Future[None] | None = None
        self._durable_seq = 0
        self._soon: asyncio.Task[None] | None = None
        # Why the function must stop (any of them sets ``halt``).
        self.halt = asyncio.Event()
        self.parked: dict[str, dict[str, Any]] = {}  # waits this drive parked on
        self.failure: dict[str, Any] | None = None  # the run's error, when the drive fails it
        self.active = 0  # step functions running now
        self.idle = asyncio.Event()
        self.idle.set()
        self.closed = False  # the drive has ended: a Context kept past it is refused
        self.fatal: BaseException | None = None  # a background commit failed: end with it
        self.returned = False  # the function has returned (or raised)
        self._opened = False
        self._pinned = spec.version
        # A code run has no graph to pause at: a "pause" policy is recorded, not applied.
        self.detector = Detector(
            run.workspace,
            {
                k: {**v, "policy": "fail" if v["policy"] == "fail" else "record"}
                for k, v in settings({}).items()
            },
            runner.retry_rates,
            functools.partial(runner.baseline, run.workspace, run.agent_name),
        )

    # -- opening ---------------------------------------------------------------------------

    async def begin(self) -> Lease | None:
        """Lease a never-started run and journal its opening, in one transaction."""
        if self.agent is None or self.agent.version != self._pinned:
            return None  # not ours to start: execute() under an ordinary lease leaves it
        events = [self.writer.event(ev.RUN_STARTED, self._started_data())]
        update = RunUpdate("running")
        lease = await self.r.store.start_run(
            self.run.id, self.r.worker_id, self.r.keeper.ttl, events, update
        )
        if lease is not None:
            self.lease = lease
            self._committed(events, update)
            self._durable_seq = self.writer.seq
            self._opened = True
        else:
            self.writer = EventWriter(self.run.id)
        return lease

    def _started_data(self) -> dict[str, Any]:
        return {"worker": self.r.worker_id, "version": self._pinned}

    async def execute(self, lease: Lease, state: RunState | None) -> None:
        self.lease = lease
        try:
            if not self._opened and not await self._open(state):
                return
            await self._supervise()
        finally:
            self.closed = True
            if self._soon is not None:
                self._soon.cancel()

    async def _open(self, state: RunState | None) -> bool:
        """Read the journal and commit this drive's opening; False when nothing is to run."""
        journal: list[Event] = []
        if state is None:
            journal = await self.r.store.events(self.run.id, blobs=True)
            state = fold(journal)
            self.detector.replay(journal)
        if state.terminal is not None:
            return False
        self._learn(journal, state)
        self.writer = EventWriter(self.run.id, state.last_seq, state.last_hash)
        self._durable_seq = state.last_seq
        if self.cancelled.is_set():
            await self._end([], RunUpdate("cancelled", error=ev.CANCELLED), ev.RUN_CANCELLED)
            return False
        self._pinned = pinned_version(self.spec, journal)
        if self.agent is None or self.agent.version != self._pinned:
            await self._leave()
            return False
        w = self.writer
        if not state.started:
            events = [w.event(ev.RUN_STARTED, self._started_data())]
            update: RunUpdate | None = RunUpdate("running")
        elif self.run.status == "waiting":
            # Woken from a park (a timer, a decision, a child's end, a version): not a crash.
            events, update = [w.event(ev.RUN_RESUMED, {"worker": self.r.worker_id})], None
            update = RunUpdate("running")
        else:
            metrics.RECOVERIES.inc()
            event, failed = recovery(
                w, state, self.r.worker_id, self.lease.epoch, self.r.max_recoveries
            )
            if failed is not None:
                await self._commit([event], failed)
                return False
            events, update = [event], None
        await self._commit(events, update)
        return True

    def _learn(self, journal: list[Event], state: RunState) -> None:
        self.order = list(state.attempts)
        self.outputs = dict(state.outputs)
        self.attempts = dict(state.attempts)
        self.retrying = dict(state.backing_off)
        self.waiting = dict(state.waiting)
        for e in journal:
            if e.kind == ev.STEP_FAILED and e.step_id is not None:
                self.errors[e.step_id] = dict(e.data.get("error") or {})
            elif e.kind == ev.STEP_STARTED and e.step_id and e.data.get("type") == "llm":
                self.model_steps.add(e.step_id)

    async def _leave(self) -> None:
        """This replica lacks the run's version: park the run until one that has it adopts
        it (or an operator moves it to another version)."""
        have = None if self.agent is None else self.agent.version
        data: dict[str, Any] = {
            "reason": "version",
            "version": self._pinned,
            "worker": self.r.worker_id,
            "workerVersion": have,
        }
        event = self.writer.event(RUN_PARKED, data)
        await self._commit([event], RunUpdate("waiting", waiting_for=self._pinned))
        log.warning(
            "run %s needs version %s of agent %s; this replica has %s: leaving it",
            self.run.id,
            self._pinned,
            self.run.agent_name,
            have or "no such agent",
        )

    # -- the function ----------------------------------------------------------------------

    async def _supervise(self) -> None:
        assert self.agent is not None
        try:
            kwargs = code_input.arguments(self.agent, self.run.input)
        except UsageError as exc:
            error = {"code": INVALID_INPUT, "message": str(exc)}
            await self._end([], RunUpdate("failed", error=error), ev.RUN_FAILED)
            return
        from lantern.engine.function_context import BlockingContext, EngineContext

        ctx = EngineContext(self)
        facade: BlockingContext | None = None
        work: Awaitable[Any]
        if self.agent.blocking:
            facade = BlockingContext(ctx, asyncio.get_running_loop())
            work = asyncio.to_thread(self.agent.fn, facade, **kwargs)
        else:
            work = self.agent.fn(ctx, **kwargs)
        task = asyncio.ensure_future(work)
        task.add_done_callback(self._returning)
        watch = [
            asyncio.ensure_future(self.cancelled.wait()),
            asyncio.ensure_future(self.halt.wait()),
            asyncio.ensure_future(self.r.stopping.wait()),
        ]
        try:
            await asyncio.wait([task, *watch], return_when=asyncio.FIRST_COMPLETED)
            if self.fatal is not None:
                await self._stop_function(task, facade)
                raise self.fatal
            if task.done():
                await self._returned(task)
                return
            if not self.cancelled.is_set() and self.failure is None:
                await self._settle_steps()  # a park or a clean stop: let running steps end
            await self._stop_function(task, facade)
            await self._stopped()
        finally:
            for w in watch:
                w.cancel()
            if not task.done():
                await self._stop_function(task, facade)

    async def _settle_steps(self) -> None:
        cancel = asyncio.ensure_future(self.cancelled.wait())
        idle = asyncio.ensure_future(self.idle.wait())
        try:
            await asyncio.wait([cancel, idle], return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancel.cancel()
            idle.cancel()

    async def _stop_function(self, task: asyncio.Future[Any], facade: Any) -> None:
        if facade is not None:
            facade.abort()  # the thread unwinds out of its blocked call
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def _stopped(self) -> None:
        """The function was stopped: journal why (and what did complete)."""
        if self.cancelled.is_set():
            await self._end([], RunUpdate("cancelled", error=ev.CANCELLED), ev.RUN_CANCELLED)
        elif self.failure is not None:
            await self._end([], RunUpdate("failed", error=self.failure), ev.RUN_FAILED)
        elif self.parked:
            await self._park()
        else:  # a clean stop of this replica: what finished is kept, the rest re-runs
            await self.durable()

    async def _returned(self, task: asyncio.Future[Any]) -> None:
        exc = task.exception()
        if exc is not None and not isinstance(exc, Exception):
            raise exc  # not the function's failure: the process is going down
        if isinstance(exc, LeaseLost):
            raise exc  # another replica has the run now
        if exc is not None:
            await self._end([], RunUpdate("failed", error=self._error_of(exc)), ev.RUN_FAILED)
            return
        found = determinism.unfinished(self.order, self.names.position)
        if found is not None:
            await self._end([], RunUpdate("failed", error=found.error()), ev.RUN_FAILED)
            return
        value = task.result()
        try:
            body = dumps(value)
            problem = text_problem(body)
        except (TypeError, ValueError) as err:
            problem = f"it is not JSON: {err}"
        if problem is not None:
            error = {
                "code": INVALID_OUTPUT,
                "message": f"the function returned a value the journal cannot store: {problem}",
            }
            await self._end([], RunUpdate("failed", error=error), ev.RUN_FAILED)
            return
        output = json.loads(body)
        await self._end([], RunUpdate("succeeded", output=output), ev.RUN_SUCCEEDED)

    def _error_of(self, exc: BaseException) -> dict[str, Any]:
        if isinstance(exc, FailedStep):
            return ev.step_failed_error(exc.step, exc.error)
        log.error(
            "run %s: the function of agent %s raised",
            self.run.id,
            self.run.agent_name,
            exc_info=exc,
        )
        message = " ".join(f"{type(exc).__name__}: {exc}".split())
        return {"code": FUNCTION_ERROR, "type": type(exc).__name__, "message": message}

    async def _end(self, events: list[NewEvent], update: RunUpdate, kind: str) -> None:
        """Journal the run's end (after what is pending)."""
        data: dict[str, Any]
        if kind == ev.RUN_SUCCEEDED:
            data = {"output": update.output}
        elif kind == ev.RUN_CANCELLED:
            data = {"by": "request"}
        else:
            data = {"error": update.error}
        self.pending += events
        await self.durable(update, (kind, data))

    async def _park(self) -> None:
        """Give the lease up and hold no task: a timer, a decision or a child wakes the run."""
        await self.durable(RunUpdate("waiting", wake_at=self._wake_at()))
        from lantern.engine.function_waits import resolved

        # A decision or a child's end that landed before the park found the run running, so
        # nothing woke it: look once more.
        for step, wait in self.parked.items():
            if await resolved(self.r.store, self.run.id, step, wait) is not None:
                await self.r.store.wake(self.run.id)
                break

    def _wake_at(self) -> Any:
        from datetime import UTC, datetime

        due = [w["dueAt"] for w in self.parked.values() if "dueAt" in w]
        due += [d for _, d in self.retrying.values()]
        return datetime.fromtimestamp(min(due) / 1000, UTC) if due else None

    # -- steps (called by the Context) -----------------------------------------------------

    def claim(self, name: str) -> str:
        """The next call's step id, checked against the journal's order."""
        step = self.names.next(name)
        found = determinism.mismatch(self.order, self.names.position, step)
        if found is not None and self.failure is None:
            self.failure = found.error()
            self.halt.set()
        return step

    async def stopped(self) -> Any:
        """Where a call goes when the function must stop: it never returns; the drive
        cancels the function."""
        await asyncio.Event().wait()

    def check_live(self) -> None:
        if self.halt.is_set() or self.cancelled.is_set() or self.r.stopping.is_set():
            return
        if not self.r.keeper.live(self.run.id):
            raise LeaseLost(self.run.id, self.lease.epoch)

    def must_stop(self) -> bool:
        return self.halt.is_set() or self.cancelled.is_set() or self.r.stopping.is_set()

    async def emit(self, drafts: list[tuple[str, dict[str, Any], str | None, int | None]]) -> None:
        """Add events (kind, data, step, attempt) to the pending commit, with the anomalies
        they raise; an anomaly whose policy is ``fail`` stops the function."""
        from datetime import UTC, datetime

        now = datetime.now(UTC)
        probes = [NewEvent(0, k, now, d, s, s, a) for k, d, s, a in drafts]
        starting = [signature(s or "", d) for k, d, s, _ in drafts if k == ev.STEP_STARTED]
        found = await self.detector.check(probes, starting)
        events: list[NewEvent] = []
        for a in found:
            data = {"kind": a.kind, "detail": a.detail, "policy": a.policy}
            events.append(self.writer.event(ev.ANOMALY_DETECTED, data))
            if a.policy == "fail" and self.failure is None:
                self.failure = ev.anomaly_error(a.kind, a.detail)
                self.halt.set()
        for kind, data, step, attempt in drafts:
            events.append(self.writer.event(kind, data, step_id=step, attempt=attempt))
        self.detector.replay(events)
        self.pending += events

    def add_completed(self, step: str, attempt: int, output: Any, body: str, usage: Any) -> None:
        """A step's completion: durable with the next commit, at the latest on the next turn
        of the event loop."""
        self.pending.append(self.writer.completed(step, attempt, output, body, usage=usage))
        self.outputs[step] = output
        if self._soon is None or self._soon.done():
            self._soon = asyncio.ensure_future(self._flush_soon())

    def _returning(self, task: asyncio.Future[Any]) -> None:
        self.returned = True  # the function's end commits what is pending, with the end

    async def _flush_soon(self) -> None:
        await asyncio.sleep(0)
        if self.pending and not self.closed and not self.returned:
            try:
                await self.durable()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # a lost lease, the store away: end the drive with it
                self.fatal = exc
                self.halt.set()

    async def durable(
        self, update: RunUpdate | None = None, last: tuple[str, dict[str, Any]] | None = None
    ) -> None:
        """Commit every event added so far (and ``update``, with its event ``last``), in
        order. Callers that come while a commit is in flight are served together by the next
        one. ``last`` is written only when its commit starts, so an event that ends the run
        is never committed apart from the status it sets."""
        while self._durable_seq < self.writer.seq or update is not None:
            if self._flushing is None:
                batch, self.pending = self.pending, []
                if last is not None:
                    batch.append(self.writer.event(*last))
                    last = None
                this, update = update, None
                self._flushing = asyncio.ensure_future(self._commit(batch, this))
                self._flushing.add_done_callback(self._flushed)
            await asyncio.shield(self._flushing)

    def _flushed(self, done: asyncio.Future[None]) -> None:
        self._flushing = None

    async def _commit(self, events: list[NewEvent], update: RunUpdate | None) -> None:
        started = time.perf_counter()
        await self.r.store.append(Append(self.lease, tuple(events), update))
        metrics.JOURNAL_WRITE.observe(time.perf_counter() - started)
        if events:
            self._durable_seq = events[-1].seq
        self._committed(events, update)

    def _committed(self, events: list[NewEvent], update: RunUpdate | None) -> None:
        if update is not None and update.releases:
            self.r.keeper.drop(self.lease)  # given up with this commit: renew it no more
        if update is not None and update.status in TERMINAL:
            self.final = update
        count_committed(events)
        for listener in self.r.app.commit_listeners:
            listener(self.run.id, events)

    def begin_attempt(self) -> None:
        self.active += 1
        self.idle.clear()

    def end_attempt(self) -> None:
        self.active -= 1
        if self.active == 0:
            self.idle.set()
