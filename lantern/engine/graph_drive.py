"""Drives a graph agent: what runs next comes from ``interpreter.plan``; the journal
discipline (opening, fenced commits, retries, anomalies, cancellation) from ``Drive``.

Write-ahead order, and what each commit carries:

1. ``run_started`` + the trigger's completion + ``step_started`` of the first steps.
2. For each batch of finished steps: their ``step_completed`` (or ``step_failed``,
   ``step_retrying``, ``step_waiting``) + ``step_started`` of every step they made ready +
   ``run_succeeded``/``run_failed`` when that ends the run.

So every step is journaled as started before it is invoked, its output is durable before any
step that may read it starts, and a step costs one commit, not two. Steps run concurrently as
tasks; a retry waits out its journaled backoff on a timer; a run with nothing left but parked
steps (approvals, signals, sub-agents) gives its lease up and holds no task until a decision,
a signal, a child's end or a timeout wakes it; so does a run with nothing running while a rate
limit holds a step back (``step_throttled``), until the step is due.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from lantern.app import Toolbox
from lantern.engine import events as ev
from lantern.engine import interpreter, spend, waits
from lantern.engine.children import start_child
from lantern.engine.drive import Drive, DriveHost, parked_until
from lantern.engine.graph import Graph
from lantern.engine.journal import RunState
from lantern.engine.ledger import Failed, Retry
from lantern.engine.retries import RetryPolicy, timeout_s
from lantern.errors import StepError, TemplateError
from lantern.nodes import StepContext
from lantern.nodes.base import Node, Noted, Waiting
from lantern.nodes.registry import WAITING_TYPES, executor_for
from lantern.nodes.secrets import with_secrets
from lantern.store.records import NewEvent, Run, RunUpdate

# A failure that ends the run: the step and its error.
Failure = tuple[str, StepError]


class GraphDrive(Drive):
    """One drive of one graph agent's run: the state between journal commits."""

    def __init__(self, host: DriveHost, run: Run, graph: Graph) -> None:
        super().__init__(host, run, anomalies=graph.anomalies, can_pause=True, budget=graph.budget)
        self.graph = graph
        self.tasks: dict[asyncio.Task[Any], str] = {}
        self.uninterruptible: set[asyncio.Task[Any]] = set()  # sync tools, in threads
        # Retry backoffs: a timer per step waiting for its next attempt (step, attempt).
        self.timers: dict[asyncio.Task[bool], tuple[str, int]] = {}
        self._spawn_first: list[tuple[str, int]] = []
        self._backoffs: dict[str, tuple[int, int]] = {}  # from the journal, to schedule
        self._secrets: list[str] | None = None
        self.skipped: set[str] = set()  # journaled as step_skipped
        self.parked = False  # parked for a rate limit's wait: the drive ends

    def step_type(self, step: str) -> str:
        node = self.graph.nodes.get(step)
        return node.type if node is not None else "approval"  # an anomaly's pause

    def opening_steps(self) -> list[NewEvent]:
        trigger = self.graph.trigger
        # The trigger has no side effect, so it starts and completes in the first commit.
        return [self.start(trigger, 1), self.ledger.completed(trigger, 1, self.run.input)]

    def plan(self, state: RunState) -> tuple[list[NewEvent], RunUpdate | None]:
        resume = [(s, state.attempts[s]) for s in state.in_flight]
        self._backoffs = state.backing_off
        self.skipped = set(state.skipped)
        try:
            planned = self._plan()
        except TemplateError as exc:
            return self._when_failed(exc)
        events = self._skips(planned)
        events += [self.start(s, 1) for s in planned.start]
        self._spawn_first = resume + [(s, 1) for s in planned.start]
        if planned.done:
            event, update = self.succeeded(planned.output)
            return [*events, event], update
        return events, None

    def _plan(self, *, hold: bool = False) -> interpreter.Plan:
        paused = any("anomaly" in w for w in self.waiting.values())  # until someone lets go
        return interpreter.plan(
            self.graph,
            self.outputs,
            self.attempts.keys() | self.outputs.keys(),
            parked=bool(self.waiting),
            hold=hold or paused,
            input=self.run.input,
        )

    def _skips(self, planned: interpreter.Plan) -> list[NewEvent]:
        """Journal, once, each step no taken edge reaches any more (``step_skipped``)."""
        fresh = planned.skipped - self.skipped
        self.skipped |= fresh
        return [
            self.ledger.event(ev.STEP_SKIPPED, {"type": self.graph.nodes[n].type}, step_id=n)
            for n in self.graph.order
            if n in fresh
        ]

    def _when_failed(self, exc: TemplateError) -> tuple[list[NewEvent], RunUpdate]:
        """A ``when`` that cannot be evaluated fails the run: routing must never guess."""
        event, update = self.run_failed(ev.run_error(ev.E_WHEN_FAILED, str(exc)))
        return [event], update

    async def proceed(self) -> None:
        for step, attempt in self._spawn_first:
            self._spawn(step, attempt)
        for step, (attempt, due) in self._backoffs.items():
            self._schedule(step, attempt, due)
        try:
            await self._loop()
        finally:
            for task in [*self.tasks, *self.timers]:
                task.cancel()

    async def _loop(self) -> None:
        cancel = asyncio.ensure_future(self.cancelled.wait())
        try:
            while True:
                await self._steps(cancel)
                if self.final is not None or self.host.stopping.is_set() or self.parked:
                    return
                if cancel.done():
                    await self._cancel([])
                    return
                if not self.waiting:
                    return
                # Nothing left to run: resume what has been decided, or park.
                if not await self._resume_waits(cancel):
                    await self._park()
                    return
                if self.final is not None:
                    return
        finally:
            cancel.cancel()

    async def _cancel(self, events: list[NewEvent]) -> None:
        """An async step is cancelled at once; a sync tool's thread cannot be interrupted, so
        the run waits for it, journals how it ended, and stops at that step boundary."""
        sync = {t: s for t, s in self.tasks.items() if t in self.uninterruptible and not t.done()}
        running = [t for t in [*self.tasks, *self.timers] if t not in sync]
        for task in running:
            task.cancel()
        if sync:
            self.waits_for_thread(list(sync.values()))
            await asyncio.wait(sync)
            for task, step in sync.items():
                exc = task.exception()
                if exc is None or isinstance(exc, StepError):
                    self._settle(step, exc if exc is not None else task.result(), events, [])
        self.tasks.clear()
        self.timers.clear()
        self.uninterruptible.clear()
        await self.cancel(events, running, list(sync.values()))

    async def _steps(self, cancel: asyncio.Future[Any]) -> None:
        while self.tasks or self.timers:
            if await self._parks_now():  # a re-drive before a rate limit's due time
                await self._park_throttled([])
                return
            await asyncio.wait(
                [*self.tasks, *self.timers, cancel], return_when=asyncio.FIRST_COMPLETED
            )
            done = [task for task in self.tasks if task.done()]
            due = [self.timers.pop(t) for t in [t for t in self.timers if t.done()]]
            events: list[NewEvent] = []
            failure: Failure | None = None
            backoffs: list[Retry] = []
            for task in done:
                step = self.tasks.pop(task)
                self.uninterruptible.discard(task)
                exc = task.exception()
                if exc is not None and not isinstance(exc, StepError):
                    raise exc
                outcome = exc if exc is not None else task.result()
                failure = self._settle(step, outcome, events, backoffs) or failure
            if not await self._advance(events, failure, backoffs, due, cancel):
                return

    def _settle(
        self, step: str, outcome: Any, events: list[NewEvent], backoffs: list[Retry]
    ) -> Failure | None:
        """Journal how a step attempt ended; the failure that ends the run, if it does."""
        attempt = self.attempts[step]
        if isinstance(outcome, Noted):
            for kind, data in outcome.notes:
                events.append(self.ledger.event(kind, data, step_id=step, attempt=attempt))
            outcome = outcome.value
        if isinstance(outcome, Waiting):
            events.append(
                self.ledger.event(ev.STEP_WAITING, outcome.data, step_id=step, attempt=attempt)
            )
            self.waiting[step] = outcome.data
            return None
        node = self.graph.nodes.get(step)
        policy = RetryPolicy.of(node.data, node.type) if node is not None else RetryPolicy()
        usage = functools.partial(spend.step_usage, self.graph, step)
        done = self.settle(step, attempt, outcome, policy, usage)
        events += done.events
        if isinstance(done.next, Retry):
            backoffs.append(done.next)
        elif isinstance(done.next, Failed):
            return step, done.next.error
        return None

    async def _advance(
        self,
        events: list[NewEvent],
        failure: Failure | None,
        backoffs: list[Retry],
        due: list[tuple[str, int]],
        cancel: asyncio.Future[Any],
    ) -> bool:
        """Commit what steps did with the steps it makes ready; False once the run ended."""
        if failure is not None:
            event, failed = self.step_ended_run(*failure)
            await self.commit([*events, event], failed)
            return False
        self.ensure_live()
        if cancel.done():
            await self._cancel(events)
            return False
        try:
            planned_now = self._plan(hold=self.host.stopping.is_set())
        except TemplateError as exc:
            routing, ended = self._when_failed(exc)
            await self.commit([*events, *routing], ended)
            return False
        events += self._skips(planned_now)
        fresh = list(planned_now.start)
        planned = [(s, 1) for s in fresh] + due
        stopped, paused = await self.anomalies(events, [s for s, _ in planned])
        if stopped is not None:
            await self.commit(events, stopped)
            return False
        if paused:
            fresh, due, planned = [], [], []  # a due retry starts after the resume
        events += [self.start(s, attempt) for s, attempt in planned]
        update: RunUpdate | None = None
        ending = self._plan(hold=True)
        if ending.done:
            event, update = self.succeeded(ending.output)
            events.append(event)
        elif not self.tasks and not planned and self._parks():
            # Nothing runs and a rate limit holds a step back: park in this same commit.
            await self._park_throttled(events)
            return False
        await self.commit(events, update)
        for step in fresh:
            self._spawn(step, 1)
        for step, attempt in due:
            self._spawn(step, attempt)
        for retry in backoffs:
            self._schedule(retry.step, retry.attempt, retry.due_ms)
        return update is None

    async def _resume_waits(self, cancel: asyncio.Future[Any]) -> bool:
        """Journal the waits that were resolved and go on from them; False if none was."""
        resolved = await waits.resolved(self.host.store, self.ledger, self.graph)
        if not resolved:
            return False
        events: list[NewEvent] = []
        failure: Failure | None = None
        backoffs: list[Retry] = []
        for step, resumed, outcome in resolved:
            del self.waiting[step]
            self.attempts.setdefault(step, 1)  # an anomaly's pause is no graph step
            events += self.ledger.resuming(step, resumed)
            failure = self._settle(step, outcome, events, backoffs) or failure
        await self._advance(events, failure, backoffs, [], cancel)
        return True

    async def _park(self) -> None:
        """Give the lease up and wait with no task: a decision, a child or a timeout wakes
        the run, on whichever replica claims it."""
        await self.commit([], RunUpdate("waiting", wake_at=waits.wake_at(self.waiting)))
        # A decision or a child's end that landed between our last look and the park found
        # the run still running, so nothing woke it: look once more.
        if await waits.resolved(self.host.store, self.ledger, self.graph):
            await self.host.store.wake(self.run.id)

    def _parks(self) -> bool:
        """Whether the run, with nothing in flight but timed waits, parks for them (a rate
        limit's wait among them: ``ledger.parked_until``) rather than hold its slot."""
        return self.ledger.parked_until() is not None

    async def _parks_now(self) -> bool:
        """``_parks`` for a run with no step running, unless one of its waits has been
        resolved meanwhile (what woke it): that one is journaled once the timers are done
        rather than woken again and again by the look after each park."""
        if self.tasks or not self._parks():
            return False
        return not (self.waiting and await waits.resolved(self.host.store, self.ledger, self.graph))

    async def _park_throttled(self, events: list[NewEvent]) -> None:
        """Park (with ``events``) until the first timed wait is due, or a parked wait's
        timeout comes first: the step a rate limit holds back holds no slot and no lease
        meanwhile, and the re-drive at the due time makes its call."""
        due = self.ledger.parked_until()
        assert due is not None
        await self.commit(events, parked_until(due, waits.wake_at(self.waiting)))
        self.parked = True
        for timer in self.timers:
            timer.cancel()
        self.timers.clear()
        # A decision or a child's end that landed before the park found the run running.
        if self.waiting and await waits.resolved(self.host.store, self.ledger, self.graph):
            await self.host.store.wake(self.run.id)

    def _schedule(self, step: str, attempt: int, due_ms: int) -> None:
        self.timers[asyncio.ensure_future(self.backoff(due_ms))] = (step, attempt)

    async def _signing_secrets(self) -> list[str]:
        """The workspace's webhook secrets, read once per drive rather than once per step."""
        if self._secrets is None:
            self._secrets = await self.host.store.signing_secrets(self.run.workspace)
        return self._secrets

    def _spawn(self, step: str, attempt: int) -> None:
        node = self.graph.nodes[step]
        visible = interpreter.ancestors(self.graph, step)
        ctx = StepContext(
            run_id=self.run.id,
            step_id=step,
            node=node,
            attempt=attempt,
            idempotency_key=self.key(step, attempt),
            scope={
                "input": self.run.input,
                "steps": {s: {"output": o} for s, o in self.outputs.items() if s in visible},
            },
            app=self.host.app,
            http=self.host.http,
            deliveries=self.deliveries(step, attempt),
            signing_secrets=self._signing_secrets,
            models=self.host.models,
            gate=spend.gate(self.host.store, self.run, self.ledger, self.host.models),
            start_child=functools.partial(self._start_child, step, attempt),
            on_text=self.host.live.sink(self.run.id, step, attempt),
            secrets=functools.partial(self.host.secret_values, self.run.workspace),
            workspace=self.run.workspace,
        )
        times_itself = node.type in WAITING_TYPES or _times_itself(node)
        limit = (
            None
            if times_itself
            else timeout_s(node.data, self.graph.timeout_ms, self.host.step_timeout)
        )
        work = with_secrets(executor_for(node.type))(ctx)
        task = self.perform(step, attempt, work, limit)
        if not _interruptible(self.host.app.tools_for(self.run.workspace), node):
            self.uninterruptible.add(task)
        task.add_done_callback(lambda _: self.host.live.finished(self.run.id, step, attempt))
        self.tasks[task] = step

    async def _start_child(self, step: str, attempt: int, agent: str, input: Any) -> str:
        """Create this step attempt's child run, or find it after a crash: its id is derived
        from (run, step, attempt), so a re-drive never starts a second one."""
        child = self.ledger.child_id(step, attempt)
        host = self.host
        return await start_child(
            host.store, host.app, self.run, child, agent, input, host.on_queued
        )


def _times_itself(node: Node) -> bool:
    """An http connector applies its ``timeoutMs`` from the moment its request is sent, so
    time spent queued for a connection slot is not counted against it."""
    return node.type == "connector" and node.data.get("connector", "http") == "http"


def _interruptible(box: Toolbox, node: Node) -> bool:
    """False for a tool node whose tool is a sync function (it runs in a thread)."""
    if node.type != "tool":
        return True
    tool = box.registered(str(node.data.get("tool")))
    return tool is None or tool.interruptible
