"""The runner: drives one run under its lease, journaling every step transition.

Write-ahead order, and what each commit carries:

1. ``run_started`` + the trigger's completion + ``step_started`` of the first steps.
2. For each finished step: its ``step_completed`` (or ``step_failed``) + ``step_started`` of
   every step it made ready + ``run_succeeded``/``run_failed`` when it ends the run.

So every step is journaled as started before it is invoked, its output is durable before any
step that may read it starts, and a step costs one commit, not two. A re-drive folds the
journal (one query), skips completed steps (the CompletedStep gate: their outputs come from
the journal and they are never invoked), re-invokes in-flight steps with the attempt they
started with (so the same idempotency key), and goes on.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import httpx

from lantern.app import App
from lantern.effects.claims import Deliveries
from lantern.engine import events as ev
from lantern.engine import interpreter, spend, waits
from lantern.engine.anomalies import RUN_TOTALS, Anomaly, Detector, RetryRates
from lantern.engine.conversation import Conversation
from lantern.engine.graph import Graph, PlainAgent, parse_agent
from lantern.engine.journal import EventWriter, RunState, count_committed, fold, recovery
from lantern.engine.leases import LeaseKeeper
from lantern.engine.live import LiveText
from lantern.engine.retries import RetryPolicy, timeout_s
from lantern.engine.runs import create_run
from lantern.errors import Conflict, LeaseLost, NotFound, StepError, TemplateError, UsageError
from lantern.ids import child_run_id, idempotency_key
from lantern.nodes import StepContext, executor_for
from lantern.nodes.base import Noted, Waiting
from lantern.nodes.registry import WAITING_TYPES
from lantern.observability import logs, metrics, tracing
from lantern.observability.steps import observed
from lantern.store.base import Store
from lantern.store.codec import dumps, text_problem
from lantern.store.records import TERMINAL, Append, Lease, NewEvent, Run, RunUpdate

log = logging.getLogger("lantern.runner")


class Runner:
    """Drives runs for one worker identity. Shared by every run this process executes."""

    def __init__(
        self,
        store: Store,
        app: App,
        keeper: LeaseKeeper,
        *,
        worker_id: str,
        http: httpx.AsyncClient,
        stopping: asyncio.Event | None = None,
        max_recoveries: int = 10,
        on_queued: Callable[[], None] = lambda: None,
        issue_receipt: Callable[[str], Awaitable[None]] | None = None,
        step_timeout: float | None = None,
        live: LiveText | None = None,
    ) -> None:
        self.store = store
        self.step_timeout = step_timeout  # a step's limit unless its node or agent sets one
        self.live = live or LiveText()  # model steps' text as it is generated (not journaled)
        self.on_queued = on_queued  # a run was queued here (a child): look for work now
        self.issue_receipt = issue_receipt  # called with a run's id once it has finished
        self.max_recoveries = max_recoveries
        self.app = app
        self.keeper = keeper
        self.worker_id = worker_id
        self.http = http
        self.stopping = stopping or asyncio.Event()
        self._graphs: dict[tuple[str, str, int], Graph | PlainAgent] = {}
        self.retry_rates = RetryRates()
        self._baselines: dict[tuple[str, str], tuple[float, dict[str, list[Any]]]] = {}

    async def baseline(self, workspace: str, agent: str) -> dict[str, list[Any]]:
        """Recent usage of the agent's steps, read at most once a minute per agent."""
        cached = self._baselines.get((workspace, agent))
        if cached is not None and time.monotonic() - cached[0] < 60:
            return cached[1]
        found: dict[str, list[Any]] = {}
        runs: dict[str, dict[str, float]] = {}
        for run_id, step, usage in await self.store.recent_step_usage(workspace, agent):
            found.setdefault(step, []).append(usage)
            total = runs.setdefault(run_id, {"inputTokens": 0, "outputTokens": 0, "costUsd": 0})
            for field in total:
                total[field] += float(usage.get(field) or 0)
        found[RUN_TOTALS] = list(runs.values())
        self._baselines[(workspace, agent)] = (time.monotonic(), found)
        return found

    async def drive(self, run_id: str, lease: Lease | None = None) -> Run | None:
        """Execute or re-drive a run; None when another worker holds it or ours was lost.

        ``lease``, when given, was won before this call (by a claim), so the run read here is
        current: a queued run then has no journal to read.
        """
        run = await self.store.get_run(run_id)
        if run is None:
            raise NotFound(f"run {run_id} not found")
        if run.finished:
            return run  # re-driving a finished run invokes nothing and writes nothing
        with tracing.drive(run, self.worker_id):
            result = await self._drive(run, lease)
            tracing.drive_ended(result)
            return result

    async def _drive(self, run: Run, lease: Lease | None) -> Run | None:
        run_id = run.id
        graph = await self._graph(run)
        drive = _new_drive(self, run, graph)
        known_empty = lease is not None and run.status == "queued"
        if lease is None and run.status == "queued" and not run.cancel_requested:
            # Lease and opening commit in one transaction: one commit fewer per run.
            lease = await drive.begin()
            if lease is None:
                drive = _new_drive(self, run, graph)
        if lease is None:
            lease = await self.store.acquire_lease(run_id, self.worker_id, self.keeper.ttl)
            if lease is None:
                return None
        self.keeper.hold(lease, drive.cancelled.set)
        try:
            await drive.execute(lease, RunState() if known_empty else None)
        except LeaseLost as exc:
            log.warning("%s", exc)
            return None
        except asyncio.CancelledError:
            # A clean shutdown cut the run short: hand it on at once rather than after the TTL.
            await asyncio.shield(self.store.release_lease(lease))
            raise
        finally:
            self.keeper.drop(lease)
        final = drive.final
        if final is None:  # stopped early (a clean stop), or another worker had finished it
            await self.store.release_lease(lease)
            return await self.store.get_run(run_id)
        # The commit that finished the run released its lease in the same transaction.
        if self.issue_receipt is not None:
            await self.issue_receipt(run_id)
        return replace(
            run,
            status=final.status,
            output=final.output,
            error=final.error,
            updated_at=datetime.now(UTC),
        )

    async def _graph(self, run: Run) -> Graph | PlainAgent:
        key = (run.workspace, run.agent_name, run.agent_version)
        graph = self._graphs.get(key)
        if graph is None:
            agent = await self.store.get_agent(*key)
            if agent is None:
                raise NotFound(f"agent {run.agent_name} v{run.agent_version} not found")
            graph = self._graphs[key] = parse_agent(agent.definition)
        return graph


def _new_drive(runner: Runner, run: Run, agent: Graph | PlainAgent) -> _Drive | Conversation:
    if isinstance(agent, PlainAgent):
        return Conversation(runner, run, agent)
    return _Drive(runner, run, agent)


class _Drive:
    """One drive of one run: the state between journal commits."""

    def __init__(self, runner: Runner, run: Run, graph: Graph) -> None:
        self.r = runner
        self.run = run
        self.graph = graph
        self.lease = Lease(run.id, runner.worker_id, 0)  # the real one comes with execute()
        self.outputs: dict[str, Any] = {}
        self.attempts: dict[str, int] = {}
        self.skipped: set[str] = set()  # journaled as step_skipped
        self.tasks: dict[asyncio.Task[Any], str] = {}
        # Retry backoffs: a timer per step waiting for its next attempt (step, attempt).
        self.timers: dict[asyncio.Task[None], tuple[str, int]] = {}
        self._backoffs: dict[str, tuple[int, int]] = {}  # from the journal, to schedule
        self.waiting: dict[str, dict[str, Any]] = {}  # parked steps: step_waiting data
        self.writer = EventWriter(run.id)
        self.final: RunUpdate | None = None  # the update that finished the run, once it has
        self._begun: list[tuple[str, int]] | None = None  # steps to spawn after begin()
        self.cancelled = asyncio.Event()  # set when a cancellation request is seen
        self._secrets: list[str] | None = None
        self.detector = Detector(
            run.workspace,
            dict(graph.anomalies),
            runner.retry_rates,
            functools.partial(runner.baseline, run.workspace, run.agent_name),
        )
        self._anomaly_error: dict[str, Any] | None = None
        if run.cancel_requested:
            self.cancelled.set()

    async def begin(self) -> Lease | None:
        """Lease a never-started run and journal its opening, in one transaction."""
        events, update, spawn = self._plan(RunState())
        assert update is not None
        lease = await self.r.store.start_run(
            self.run.id, self.r.worker_id, self.r.keeper.ttl, events, update
        )
        if lease is not None:
            self._committed(events, update)
            self._begun = spawn
        return lease

    async def execute(self, lease: Lease, state: RunState | None) -> None:
        """Drive from the journal (``state`` None: read it) to the end, or to a stop."""
        self.lease = lease
        spawn = self._begun
        if spawn is None:
            if state is None:
                journal = await self.r.store.events(self.run.id, blobs=True)
                state = fold(journal)
                self.detector.replay(journal)
            if state.terminal is not None:
                return
            if self.cancelled.is_set():
                self.writer = EventWriter(self.run.id, state.last_seq, state.last_hash)
                await self._cancel([])
                return
            events, update, spawn = self._plan(state)
            await self._commit(events, update)
        for step, attempt in spawn:
            self._spawn(step, attempt)
        for step, (attempt, due) in self._backoffs.items():
            self._schedule(step, attempt, due)
        try:
            await self._loop()
        finally:
            for task in [*self.tasks, *self.timers]:
                task.cancel()

    def _plan(
        self, state: RunState
    ) -> tuple[list[NewEvent], RunUpdate | None, list[tuple[str, int]]]:
        """The opening commit of this drive, and the steps to spawn once it is durable."""
        self.writer = EventWriter(self.run.id, state.last_seq, state.last_hash)
        self.outputs = dict(state.outputs)
        self.attempts = dict(state.attempts)
        self.skipped = set(state.skipped)
        events, update = self._opening(state)
        if update is not None and update.status in TERMINAL:
            return events, update, []
        resume = [(s, state.attempts[s]) for s in state.in_flight]
        self._backoffs = state.backing_off
        self.waiting = dict(state.waiting)
        try:
            fresh = self._ready()
            events += self._skips()
        except TemplateError as exc:
            failed, update = self._when_failed(exc)
            return [*events, *failed], update, []
        events += self._start([(s, 1) for s in fresh])
        if self._finished() and not self.waiting:
            events, update = self._succeeded(events)
        return events, update, resume + [(s, 1) for s in fresh]

    def _opening(self, state: RunState) -> tuple[list[NewEvent], RunUpdate | None]:
        w = self.writer
        if state.started and self.run.status == "waiting":
            # Woken from a park (a decision, a child's end, a timeout): not a recovery.
            return [w.event(ev.RUN_RESUMED, {"worker": self.r.worker_id})], RunUpdate("running")
        if state.started:
            metrics.RECOVERIES.inc()
            event, update = recovery(
                w, state, self.r.worker_id, self.lease.epoch, self.r.max_recoveries
            )
            if update is None:
                tracing.recovered(self.run.id, self.graph, state, state.recoveries + 1)
            return [event], update
        trigger = self.graph.trigger
        self.outputs[trigger] = self.run.input
        self.attempts[trigger] = 1
        return [
            w.event(ev.RUN_STARTED, {"worker": self.r.worker_id}),
            # The trigger has no side effect, so it starts and completes in the first commit.
            w.event(ev.STEP_STARTED, {"type": "trigger"}, step_id=trigger, attempt=1),
            w.completed(trigger, 1, self.run.input),
        ], RunUpdate("running")

    def _ready(self) -> list[str]:
        if any("anomaly" in w for w in self.waiting.values()):
            return []  # paused by an anomaly until someone lets it go on
        started = self.attempts.keys() | self.outputs.keys()
        return interpreter.ready(self.graph, self.outputs, started, self.run.input)

    def _finished(self) -> bool:
        return interpreter.finished(self.graph, self.outputs, self.run.input)

    def _skips(self) -> list[NewEvent]:
        """Journal each step that no taken edge reaches any more (``step_skipped``)."""
        found = interpreter.skipped(self.graph, self.outputs, self.run.input) - self.skipped
        self.skipped |= found
        return [
            self.writer.event(ev.STEP_SKIPPED, {"type": self.graph.nodes[n].type}, step_id=n)
            for n in self.graph.order
            if n in found
        ]

    def _when_failed(self, exc: TemplateError) -> tuple[list[NewEvent], RunUpdate]:
        """A ``when`` that cannot be evaluated fails the run: routing must never guess."""
        error = ev.run_error(ev.E_WHEN_FAILED, str(exc))
        return [self.writer.event(ev.RUN_FAILED, {"error": error})], RunUpdate(
            "failed", error=error
        )

    def _start(self, steps: Sequence[tuple[str, int]]) -> list[NewEvent]:
        """Journal the start of each (step, attempt)."""
        for step, attempt in steps:
            self.attempts[step] = attempt
        return [
            self.writer.event(
                ev.STEP_STARTED, {"type": self.graph.nodes[s].type}, step_id=s, attempt=attempt
            )
            for s, attempt in steps
        ]

    def _succeeded(self, events: list[NewEvent]) -> tuple[list[NewEvent], RunUpdate]:
        output = interpreter.run_output(self.graph, self.outputs)
        events.append(self.writer.event(ev.RUN_SUCCEEDED, {"output": output}))
        return events, RunUpdate("succeeded", output=output)

    async def _loop(self) -> None:
        cancel = asyncio.ensure_future(self.cancelled.wait())
        try:
            while True:
                await self._steps(cancel)
                if self.final is not None or self.r.stopping.is_set():
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
        """Stop the steps in flight and journal the cancellation (with what did complete)."""
        for task in [*self.tasks, *self.timers]:
            task.cancel()
        await asyncio.gather(*self.tasks, *self.timers, return_exceptions=True)
        self.tasks.clear()
        self.timers.clear()
        events.append(self.writer.event(ev.RUN_CANCELLED, {"by": "request"}))
        await self._commit(events, RunUpdate("cancelled", error=ev.CANCELLED))

    async def _steps(self, cancel: asyncio.Future[Any]) -> None:
        while self.tasks or self.timers:
            await asyncio.wait(
                [*self.tasks, *self.timers, cancel], return_when=asyncio.FIRST_COMPLETED
            )
            done = [task for task in self.tasks if task.done()]
            due = [self.timers.pop(t) for t in [t for t in self.timers if t.done()]]
            events: list[NewEvent] = []
            failure: tuple[str, StepError] | None = None
            backoffs: list[tuple[str, int, int]] = []
            for task in done:
                step = self.tasks.pop(task)
                exc = task.exception()
                if exc is not None and not isinstance(exc, StepError):
                    raise exc
                outcome = exc if exc is not None else task.result()
                failure = self._settle(step, outcome, events, backoffs) or failure
            if not await self._advance(events, failure, backoffs, due, cancel):
                return

    def _settle(
        self,
        step: str,
        outcome: Any,
        events: list[NewEvent],
        backoffs: list[tuple[str, int, int]],
    ) -> tuple[str, StepError] | None:
        """Journal how a step attempt ended; the failure that ends the run, if it does."""
        attempt = self.attempts[step]
        if isinstance(outcome, Noted):
            for kind, data in outcome.notes:
                events.append(self.writer.event(kind, data, step_id=step, attempt=attempt))
            outcome = outcome.value
        if isinstance(outcome, Waiting):
            events.append(
                self.writer.event(ev.STEP_WAITING, outcome.data, step_id=step, attempt=attempt)
            )
            self.waiting[step] = outcome.data
            return None
        if not isinstance(outcome, StepError):
            try:
                body = dumps(outcome)
                problem = text_problem(body)
                if problem is None:
                    # Downstream steps see exactly what a replay would read back. Canonical
                    # JSON (the hash chain) refuses what JSON cannot carry exactly, such as
                    # integers beyond 2^53.
                    output = json.loads(body)
                    usage = spend.step_usage(self.graph, step, output)
                    events.append(self.writer.completed(step, attempt, output, body, usage=usage))
                    self.outputs[step] = output
                    return None
            except (TypeError, ValueError) as err:
                problem = f"it is not JSON: {err}"
            outcome = StepError(
                f"step {step!r} returned a value the journal cannot store: {problem}",
                error_class="tool",
            )
        node = self.graph.nodes[step]
        policy = RetryPolicy.of(node.data, node.type)
        if policy.retries(outcome, attempt):
            events.append(self._retrying(step, attempt, policy, outcome, backoffs))
            return None
        events.append(
            self.writer.event(
                ev.STEP_FAILED, {"error": outcome.to_json()}, step_id=step, attempt=attempt
            )
        )
        return step, outcome

    async def _advance(
        self,
        events: list[NewEvent],
        failure: tuple[str, StepError] | None,
        backoffs: list[tuple[str, int, int]],
        due: list[tuple[str, int]],
        cancel: asyncio.Future[Any],
    ) -> bool:
        """Commit what steps did with the steps it makes ready; False once the run ended."""
        if failure is not None:
            step, exc = failure
            error = ev.step_failed_error(step, exc.to_json())
            events.append(self.writer.event(ev.RUN_FAILED, {"error": error}))
            await self._commit(events, RunUpdate("failed", error=error))
            return False
        if not self.r.keeper.live(self.run.id):
            # Lost, or not renewed for a whole TTL (the database away): start nothing
            # more; whoever holds the run next re-drives it from the journal.
            raise LeaseLost(self.run.id, self.lease.epoch)
        if cancel.done():
            await self._cancel(events)
            return False
        try:
            fresh = [] if self.r.stopping.is_set() else self._ready()
            events += self._skips()
        except TemplateError as exc:
            failed, ended = self._when_failed(exc)
            await self._commit(events + failed, ended)
            return False
        planned = [(s, 1) for s in fresh] + due
        found = await self.detector.check(events, [s for s, _ in planned])
        if found:
            events += self._anomalies(found)
            if self._anomaly_error is not None:
                events.append(self.writer.event(ev.RUN_FAILED, {"error": self._anomaly_error}))
                await self._commit(events, RunUpdate("failed", error=self._anomaly_error))
                return False
            if any(a.policy == "pause" for a in found):
                fresh, due, planned = [], [], []  # a due retry starts after the resume
        events += self._start(planned)
        update = None
        if self._finished() and not self.waiting:
            events, update = self._succeeded(events)
        await self._commit(events, update)
        for step in fresh:
            self._spawn(step, 1)
        for step, attempt in due:
            self._spawn(step, attempt)
        for step, attempt, due_ms in backoffs:
            self._schedule(step, attempt, due_ms)
        return update is None

    def _anomalies(self, found: Sequence[Anomaly]) -> list[NewEvent]:
        """Journal each anomaly and apply its policy: record, pause (an implicit approval
        named ``anomaly:<kind>``) or fail (``_anomaly_error`` set)."""
        events = []
        for a in found:
            data = {"kind": a.kind, "detail": a.detail, "policy": a.policy}
            events.append(self.writer.event(ev.ANOMALY_DETECTED, data))
            if a.policy == "fail" and self._anomaly_error is None:
                self._anomaly_error = ev.anomaly_error(a.kind, a.detail)
            elif a.policy == "pause":
                step = f"anomaly:{a.kind}"
                wait = {
                    "kind": "approval",
                    "anomaly": a.kind,
                    "prompt": f"Anomaly {a.kind}: {a.detail}. Let the run go on?",
                }
                events.append(self.writer.event(ev.STEP_WAITING, wait, step_id=step, attempt=1))
                self.waiting[step] = wait
                self.attempts[step] = 1
        return events

    async def _resume_waits(self, cancel: asyncio.Future[Any]) -> bool:
        """Journal the waits that were resolved and go on from them; False if none was."""
        resolved = await waits.resolved(self.r.store, self.run.id, self.graph, self.waiting)
        if not resolved:
            return False
        events: list[NewEvent] = []
        failure: tuple[str, StepError] | None = None
        backoffs: list[tuple[str, int, int]] = []
        for step, resumed, outcome in resolved:
            del self.waiting[step]
            self.attempts.setdefault(step, 1)  # an anomaly's pause is no graph step
            events.append(
                self.writer.event(
                    ev.STEP_RESUMED, resumed, step_id=step, attempt=self.attempts[step]
                )
            )
            failure = self._settle(step, outcome, events, backoffs) or failure
        await self._advance(events, failure, backoffs, [], cancel)
        return True

    async def _park(self) -> None:
        """Give the lease up and wait with no task: a decision, a child or a timeout wakes
        the run, on whichever replica claims it."""
        await self._commit([], RunUpdate("waiting", wake_at=waits.wake_at(self.waiting)))
        # A decision or a child's end that landed between our last look and the park found
        # the run still running, so nothing woke it: look once more.
        if await waits.resolved(self.r.store, self.run.id, self.graph, self.waiting):
            await self.r.store.wake(self.run.id)

    def _retrying(
        self,
        step: str,
        attempt: int,
        policy: RetryPolicy,
        error: StepError,
        backoffs: list[tuple[str, int, int]],
    ) -> NewEvent:
        """Journal that ``step`` gets another attempt, and when (which survives a crash)."""
        delay = policy.delay_ms(attempt)
        due = int(time.time() * 1000) + delay
        backoffs.append((step, attempt + 1, due))
        data = {
            "attempt": attempt + 1,
            "of": policy.max_attempts,
            "error": error.to_json(),
            "delayMs": delay,
            "dueAt": due,
        }
        return self.writer.event(ev.STEP_RETRYING, data, step_id=step, attempt=attempt + 1)

    def _schedule(self, step: str, attempt: int, due_ms: int) -> None:
        delay = max(0.0, due_ms / 1000 - time.time())
        self.timers[asyncio.ensure_future(asyncio.sleep(delay))] = (step, attempt)

    async def _signing_secrets(self) -> list[str]:
        """The workspace's webhook secrets, read once per drive rather than once per step."""
        if self._secrets is None:
            self._secrets = await self.r.store.signing_secrets(self.run.workspace)
        return self._secrets

    def _spawn(self, step: str, attempt: int) -> None:
        node = self.graph.nodes[step]
        visible = interpreter.ancestors(self.graph, step)
        key = idempotency_key(self.run.id, step, attempt)
        ctx = StepContext(
            run_id=self.run.id,
            step_id=step,
            node=node,
            attempt=attempt,
            idempotency_key=key,
            scope={
                "input": self.run.input,
                "steps": {s: {"output": o} for s, o in self.outputs.items() if s in visible},
            },
            app=self.r.app,
            http=self.r.http,
            deliveries=Deliveries(
                self.r.store, self.lease, step_id=step, attempt=attempt, idempotency_key=key
            ),
            signing_secrets=self._signing_secrets,
            gate=spend.gate(
                self.r.store,
                self.run,
                self.graph.budget,
                lambda: spend.of_graph(self.graph, self.outputs),
            ),
            start_child=functools.partial(self._start_child, step, attempt),
            on_text=self.r.live.sink(self.run.id, step, attempt),
        )
        work = observed(executor_for(node.type), ctx)
        limit = (
            None
            if node.type in WAITING_TYPES
            else timeout_s(node.data, self.graph.timeout_ms, self.r.step_timeout)
        )
        if limit is not None:
            work = _within(work, limit, step)
        task = asyncio.ensure_future(work)
        task.add_done_callback(lambda _: self.r.live.finished(self.run.id, step, attempt))
        self.tasks[task] = step

    async def _start_child(self, step: str, attempt: int, agent: str, input: Any) -> str:
        """Create this step attempt's child run, or find it after a crash: its id is derived
        from (run, step, attempt), so a re-drive never starts a second one."""
        child_id = child_run_id(self.run.id, step, attempt)
        try:
            await create_run(
                self.r.store,
                agent,
                input,
                self.run.workspace,
                idempotency_key=f"subagent:{child_id}",
                run_id=child_id,
                parent_id=self.run.id,
            )
        except (NotFound, UsageError, Conflict) as exc:
            raise StepError(f"sub-agent {agent!r}: {exc}", error_class="tool") from exc
        self.r.on_queued()
        return child_id

    async def _commit(self, events: list[NewEvent], update: RunUpdate | None) -> None:
        started = time.perf_counter()
        await self.r.store.append(Append(self.lease, tuple(events), update))
        metrics.JOURNAL_WRITE.observe(time.perf_counter() - started)
        self._committed(events, update)

    def _committed(self, events: list[NewEvent], update: RunUpdate | None) -> None:
        self.detector.replay(events)
        if update is not None and update.releases:
            self.r.keeper.drop(self.lease)  # given up with this commit: renew it no more
        if update is not None and update.status in TERMINAL:
            self.final = update
        count_committed(events)
        run = self.run
        logs.run_events(run.id, run.agent_name, run.agent_version, self.r.worker_id, events)
        for listener in self.r.app.commit_listeners:
            listener(self.run.id, events)


async def _within(work: Awaitable[Any], limit: float, step: str) -> Any:
    """The step's work, cancelled when it runs past its ``timeoutMs``."""
    try:
        return await asyncio.wait_for(work, limit)
    except TimeoutError:
        raise StepError(
            f"step {step!r} timed out after {round(limit * 1000)} ms",
            error_class="timeout",
            retryable=True,
        ) from None
