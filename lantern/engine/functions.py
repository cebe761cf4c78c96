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

``sleep``, ``approval``, ``wait_for_signal``, ``run_agent`` and a model call a rate limit holds
back (``step_throttled``, until its due time) park: their wait is journaled (``step_waiting``
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
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from lantern.app import CodeAgent
from lantern.engine import code_input, commits, determinism
from lantern.engine import events as ev
from lantern.engine.anomalies import settings, signature
from lantern.engine.code_agents import CodeSpec
from lantern.engine.drive import Drive, DriveHost
from lantern.engine.function_context import BlockingContext, EngineContext
from lantern.engine.function_waits import resolved
from lantern.engine.journal import RunState
from lantern.engine.ledger import Entry, FailedStep, Nondeterminism, encoded
from lantern.errors import LeaseLost, UsageError
from lantern.store.records import TERMINAL, Lease, NewEvent, Run, RunUpdate

log = logging.getLogger("lantern.functions")

# How long a new run's opening waits for the function's first step to go with it.
OPENING_PATIENCE = 0.1

FUNCTION_ERROR = "function_error"
INVALID_INPUT = "invalid_input"
INVALID_OUTPUT = "invalid_output"


class FunctionDrive(Drive):
    """One drive of one code-first run: the function decides, ``Drive`` journals."""

    def __init__(self, host: DriveHost, run: Run, spec: CodeSpec) -> None:
        # A function has no graph to pause at: a "pause" policy is recorded, not applied.
        # None for a workspace it does not serve: such a run fails as one of an unknown agent.
        agent: CodeAgent | None = host.app.agent_for(run.workspace, run.agent_name)
        budget = None if agent is None else agent.budget  # the pinned version's
        super().__init__(host, run, anomalies=settings({}), can_pause=False, budget=budget)
        self.spec = spec
        self.agent = agent
        self.names = determinism.StepNames()
        # Commits: events wait in ``pending`` until a caller needs them durable.
        self.pending: list[NewEvent] = []
        self._flushing: asyncio.Future[None] | None = None  # the commit in flight
        self._waiters: list[asyncio.Future[None]] = []  # callers of durable() it will serve
        self._soon_due = False  # a flush of step completions is scheduled
        self._durable_seq = 0
        self._soon: asyncio.Task[None] | None = None
        # Why the function must stop (any of them sets ``halt``).
        self.halt = asyncio.Event()
        self.parked: dict[str, dict[str, Any]] = {}  # waits this drive parked on
        self.throttled = False  # a rate limit's wait parks the run (its due time is journaled)
        self.ending_error: dict[str, Any] | None = None  # the run's error, when the drive fails it
        self.fatal: BaseException | None = None  # a background commit failed: end with it
        self.returned = False  # the function has returned (or raised)
        self.active = 0  # step functions running now
        self.idle = asyncio.Event()
        self.idle.set()
        self.closed = False  # the drive has ended: a Context kept past it is refused
        self._pinned = spec.version
        # The function's task (started by ``begin`` for a new run, else by ``proceed``).
        self._task: asyncio.Future[Any] | None = None
        self._facade: Any = None  # a plain ``def`` agent's BlockingContext
        self.invalid: dict[str, Any] | None = None  # the input does not fit the function
        # The opening events and run update, not committed yet: they go with the first
        # commit the function asks for, as a graph's opening goes with its first step.
        self._opening: tuple[list[NewEvent], RunUpdate | None] | None = None
        self._wants_lease: asyncio.Future[None] | None = None  # the function's first commit
        self._leased: asyncio.Future[None] | None = None  # begin() has won the lease
        self._open_soon: asyncio.Task[None] | None = None

    # -- what Drive asks of a kind of run --------------------------------------------------

    def step_type(self, step: str) -> str:
        return self.ledger.types.get(step, "step")

    def plan(self, state: RunState) -> tuple[list[NewEvent], RunUpdate | None]:
        return [], None  # nothing starts before the function asks for it

    async def begin(self) -> Lease | None:
        """Lease a never-started run and journal its opening in one transaction, with the
        first step the function asks for: the function runs up to its first ``ctx`` call
        before the lease is won (code between steps is deterministic and does nothing a
        re-drive would not do again), so a code run's opening costs no commit of its own, as
        a graph's first step rides with its ``run_started``."""
        if self.agent is None or self.agent.version != self._pinned:
            return None  # not ours to start: execute() under an ordinary lease leaves it
        if not self._start_function():  # bad input: proceed() fails the run after the opening
            lease = await super().begin()
            self._durable_seq = self.ledger.seq
            return lease
        assert self._task is not None
        self.ledger = self.new_ledger()
        events, update = self._open()
        self._opening = (events, update)
        loop = asyncio.get_running_loop()
        self._wants_lease = loop.create_future()
        self._leased = loop.create_future()
        try:
            # Bounded: a function that awaits something else first opens without its step.
            await asyncio.wait(
                [self._task, self._wants_lease],
                timeout=OPENING_PATIENCE,
                return_when=asyncio.FIRST_COMPLETED,
            )
            batch, _ = self._take()
            lease = await commits.start(
                self.host.store,
                self.run.id,
                self.host.worker_id,
                self.host.keeper.ttl,
                batch,
                update or RunUpdate("running"),
                self.new,
            )
        except BaseException:
            await self._abandon()
            raise
        if lease is None:  # another worker started it: this drive is dropped
            await self._abandon()
            return None
        self.lease = lease
        self._committed(batch, update)
        self._opened = True
        # Not writer.seq: concurrent steps may have queued more while the start was in flight.
        self._durable_seq = batch[-1].seq
        self._leased.set_result(None)
        return lease

    async def _abandon(self) -> None:
        self.closed = True
        if self._leased is not None and not self._leased.done():
            self._leased.cancel()
        if self._task is not None:
            await self._stop_function(self._task, self._facade)

    async def execute(self, lease: Lease, state: RunState | None) -> None:
        """Drive's opening, after two checks of its own: the run's version, and what the
        journal holds for a function (failed steps' errors, step types, the order)."""
        self.lease = lease
        try:
            if not self._opened:
                if state is None:
                    journal = await self.host.store.events(self.run.id, blobs=True)
                    self.ledger = self.new_ledger(journal)
                    self.detector.replay(journal)
                else:
                    self.ledger = self.new_ledger()
                if self.ledger.state.terminal is not None:
                    return
                if self.cancelled.is_set():
                    await self.cancel([])
                    return
                self._pinned = self.ledger.pinned or self.spec.version
                if self.agent is None or self.agent.version != self._pinned:
                    await self._leave()
                    return
                events, update = self._open()
                if update is not None and update.status in TERMINAL:
                    await self.commit(events, update)  # recovery exhausted: nothing to run
                    return
                # Committed with the first step the function asks for (``durable``), or on
                # its own after OPENING_PATIENCE, so the run never looks unstarted for long.
                self._opening = (events, update)
                self._open_soon = asyncio.ensure_future(self._open_later())
            if self.final is None:
                await self.proceed()
        finally:
            self.closed = True
            for task in (self._soon, self._open_soon):
                if task is not None:
                    task.cancel()

    async def _leave(self) -> None:
        """This replica lacks the run's version: park the run until one that has it adopts
        it (or an operator moves it to another version)."""
        have = None if self.agent is None else self.agent.version
        data: dict[str, Any] = {
            "reason": "version",
            "version": self._pinned,
            "worker": self.host.worker_id,
            "workerVersion": have,
        }
        event = self.ledger.event(ev.RUN_PARKED, data)
        await self.commit([event], RunUpdate("waiting", waiting_for=self._pinned))
        log.warning(
            "run %s needs version %s of agent %s; this replica has %s: leaving it",
            self.run.id,
            self._pinned,
            self.run.agent_name,
            have or "no such agent",
        )

    # -- the function ----------------------------------------------------------------------

    def _start_function(self) -> bool:
        """Call the function (its task runs up to its first ``ctx`` call); False when the
        run's input does not fit its signature (``invalid`` says why)."""
        assert self.agent is not None
        try:
            kwargs = code_input.arguments(self.agent, self.run.input)
        except UsageError as exc:
            self.invalid = {"code": INVALID_INPUT, "message": str(exc)}
            return False
        ctx = EngineContext(self)
        work: Awaitable[Any]
        if self.agent.blocking:
            self._facade = BlockingContext(ctx, asyncio.get_running_loop())
            work = asyncio.to_thread(self.agent.fn, self._facade, **kwargs)
        else:
            work = self.agent.fn(ctx, **kwargs)
        self._task = task = asyncio.ensure_future(work)
        task.add_done_callback(self._returning)
        return True

    async def proceed(self) -> None:
        if self._task is None and self.invalid is None:
            self._start_function()
        if self._task is None:
            invalid = self.invalid
            assert invalid is not None
            await self._end(lambda: self.run_failed(invalid))
            return
        task, facade = self._task, self._facade
        watch = [
            asyncio.ensure_future(self.cancelled.wait()),
            asyncio.ensure_future(self.halt.wait()),
            asyncio.ensure_future(self.host.stopping.wait()),
        ]
        try:
            await asyncio.wait([task, *watch], return_when=asyncio.FIRST_COMPLETED)
            if self.fatal is not None:
                await self._stop_function(task, facade)
                raise self.fatal
            if task.done():
                await self._returned(task)
                return
            if not self.cancelled.is_set() and self.ending_error is None:
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
            await self._end(self._cancelled)
        elif self.ending_error is not None:
            failure = self.ending_error
            await self._end(lambda: self.run_failed(failure))
        elif self.parked or self.throttled:
            await self._park()
        else:  # a clean stop of this replica: what finished is kept, the rest re-runs
            await self.durable()

    def _cancelled(self) -> tuple[NewEvent, RunUpdate]:
        return self.ledger.cancelled()

    async def _returned(self, task: asyncio.Future[Any]) -> None:
        exc = task.exception()
        if exc is not None and not isinstance(exc, Exception):
            raise exc  # not the function's failure: the process is going down
        if isinstance(exc, LeaseLost):
            raise exc  # another replica has the run now
        if exc is not None:
            error = self._error_of(exc)
            await self._end(lambda: self.run_failed(error))
            return
        found = determinism.unfinished(self.ledger.order, self.names.position)
        if found is not None:
            mismatch = found.error()
            await self._end(lambda: self.run_failed(mismatch))
            return
        stored = encoded(task.result(), self.ledger.max_output)
        if isinstance(stored, str):
            error = {
                "code": INVALID_OUTPUT,
                "message": f"the function returned a value the journal cannot store: {stored}",
            }
            await self._end(lambda: self.run_failed(error))
            return
        output = stored[0]
        await self._end(lambda: self.succeeded(output))

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

    async def _end(self, end: Callable[[], tuple[NewEvent, RunUpdate]]) -> None:
        """Journal the run's end after what is pending; ``end`` makes its event when the
        commit starts, so that event is the commit's last and never apart from its status."""
        await self.durable(end=end)

    async def _park(self) -> None:
        """Give the lease up and hold no task: a timer, a decision or a child wakes the run."""
        await self.durable(RunUpdate("waiting", wake_at=self._wake_at()))
        # A decision or a child's end that landed before the park found the run running, so
        # nothing woke it: look once more.
        for step, wait in self.parked.items():
            if await resolved(self.host.store, self.ledger, step, wait) is not None:
                await self.host.store.wake(self.run.id)
                break

    def _wake_at(self) -> datetime | None:
        due = [w["dueAt"] for w in self.parked.values() if "dueAt" in w]
        due += [d for _, d in self.ledger.backing_off.values()]
        return datetime.fromtimestamp(min(due) / 1000, UTC) if due else None

    # -- steps (called by the Context) -----------------------------------------------------

    def claim(self, name: str) -> tuple[str, Entry]:
        """The next call's step id and what the ledger says of it; a call that is not the
        one the journal holds at its position stops the function (``nondeterminism``)."""
        step = self.names.next(name)
        entry = self.ledger.enter(step, self.names.position)
        if isinstance(entry, Nondeterminism) and self.ending_error is None:
            self.ending_error = entry.mismatch.error()
            self.halt.set()
        return step, entry

    async def stopped(self) -> Any:
        """Where a call goes when the function must stop: it never returns; the drive
        cancels the function."""
        await asyncio.Event().wait()

    def check_live(self) -> None:
        if not self.must_stop():
            self.ensure_live()

    def must_stop(self) -> bool:
        return self.halt.is_set() or self.cancelled.is_set() or self.host.stopping.is_set()

    async def emit(self, drafts: list[tuple[str, dict[str, Any], str | None, int | None]]) -> None:
        """Add events (kind, data, step, attempt) to the pending commit, then the anomalies
        they raise. Events are made and queued in one go (no await between), so they are
        committed in the order of their sequence numbers."""
        events: list[NewEvent] = []
        for kind, data, step, attempt in drafts:
            if kind == ev.STEP_STARTED and step is not None and attempt is not None:
                events.append(self.start(step, attempt, data))
            else:
                events.append(self.ledger.event(kind, data, step_id=step, attempt=attempt))
        self.pending += events
        await self.notice(events)

    async def notice(self, events: list[NewEvent]) -> None:
        """Journal the anomalies that queued ``events`` raise; one whose policy is ``fail``
        stops the function and fails the run (a "pause" is recorded: nowhere to park)."""
        starting = [signature(e.step_id or "", e.data) for e in events if e.kind == ev.STEP_STARTED]
        found = await self.detector.check(events, starting)
        if not found:
            return
        noted, error, _ = self.ledger.anomalies(found, can_pause=False)
        self.pending += noted
        if error is not None and self.ending_error is None:
            self.ending_error = error
            self.halt.set()

    def add(self, event: NewEvent) -> None:
        """A step's completion: durable with the next commit, at the latest on the next turn
        of the event loop."""
        self.pending.append(event)
        if not self._soon_due:
            # A callback, not a task: the next step's start usually takes the completion
            # with it before the loop comes round, and then nothing more is needed.
            self._soon_due = True
            asyncio.get_running_loop().call_soon(self._flush_soon)

    def _returning(self, task: asyncio.Future[Any]) -> None:
        self.returned = True  # the function's end commits what is pending, with the end

    async def _open_later(self) -> None:
        await asyncio.sleep(OPENING_PATIENCE)
        if self._opening is not None:
            await self._flush()

    def _flush_soon(self) -> None:
        self._soon_due = False
        if self.pending and (self._soon is None or self._soon.done()):
            self._soon = asyncio.ensure_future(self._flush())

    async def _flush(self) -> None:
        if not self.closed and not self.returned:
            try:
                await self.durable()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # a lost lease, the store away: end the drive with it
                self.fatal = exc
                self.halt.set()

    async def durable(
        self,
        update: RunUpdate | None = None,
        end: Callable[[], tuple[NewEvent, RunUpdate]] | None = None,
    ) -> None:
        """Commit every event added so far (and ``update``, or the run's ``end``), in order,
        through Drive's fenced commit. Callers that come while a commit is in flight are
        served together by the next one."""
        while self._durable_seq < self.ledger.seq or update is not None or end is not None:
            if self._leased is not None and not self._leased.done():
                # Not leased yet (``begin``): the first commit is the run's start.
                if self._wants_lease is not None and not self._wants_lease.done():
                    self._wants_lease.set_result(None)
                await asyncio.shield(self._leased)
                continue
            if self._flushing is None:
                batch, opening = self._take()
                if end is not None:
                    last, update = end()
                    batch.append(last)
                    end = None
                this, update = update or opening, None
                self._flushing = asyncio.ensure_future(self._commit(batch, this))
            # A waiter of its own rather than the commit task itself: a caller cancelled
            # while it waits does not cancel the commit that carries others' events too.
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def _take(self) -> tuple[list[NewEvent], RunUpdate | None]:
        """What is pending, after the opening when it has not been committed yet (with the
        opening's run update)."""
        batch, self.pending = self.pending, []
        if self._opening is None:
            return batch, None
        (events, update), self._opening = self._opening, None
        return events + batch, update

    async def _commit(self, events: list[NewEvent], update: RunUpdate | None) -> None:
        """One commit, then its waiters told how it went (directly, which wakes them a turn
        of the loop sooner than a done-callback would)."""
        error: BaseException | None = None
        try:
            await self.commit(events, update)
            if events:
                self._durable_seq = events[-1].seq
        except BaseException as exc:
            error = exc
        self._flushing = None
        waiters, self._waiters = self._waiters, []
        told = False
        for waiter in waiters:
            if waiter.done():
                continue  # its caller was cancelled
            if error is None:
                waiter.set_result(None)
            elif isinstance(error, asyncio.CancelledError):
                waiter.cancel()
            else:
                waiter.set_exception(error)
                told = True
        if error is not None and not told and not isinstance(error, asyncio.CancelledError):
            self.fatal = error  # nobody waited for it: the drive ends with it
            self.halt.set()

    def begin_attempt(self) -> None:
        self.active += 1
        self.idle.clear()

    def end_attempt(self) -> None:
        self.active -= 1
        if self.active == 0:
            self.idle.set()
