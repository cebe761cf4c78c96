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
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import httpx

from lantern.app import App
from lantern.effects.claims import Deliveries
from lantern.engine import interpreter
from lantern.engine.cancel import CANCELLED
from lantern.engine.graph import Graph, parse_agent
from lantern.engine.journal import EventWriter, RunState, fold
from lantern.engine.leases import LeaseKeeper
from lantern.errors import LeaseLost, NotFound, StepError
from lantern.ids import idempotency_key
from lantern.nodes import StepContext, executor_for
from lantern.observability import metrics, tracing
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
    ) -> None:
        self.store = store
        self.max_recoveries = max_recoveries
        self.app = app
        self.keeper = keeper
        self.worker_id = worker_id
        self.http = http
        self.stopping = stopping or asyncio.Event()
        self._graphs: dict[tuple[str, str, int], Graph] = {}

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
        drive = _Drive(self, run, graph)
        known_empty = lease is not None and run.status == "queued"
        if lease is None and run.status == "queued" and not run.cancel_requested:
            # Lease and opening commit in one transaction: one commit fewer per run.
            lease = await drive.begin()
            if lease is None:
                drive = _Drive(self, run, graph)
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
        return replace(
            run,
            status=final.status,
            output=final.output,
            error=final.error,
            updated_at=datetime.now(UTC),
        )

    async def _graph(self, run: Run) -> Graph:
        key = (run.workspace, run.agent_name, run.agent_version)
        graph = self._graphs.get(key)
        if graph is None:
            agent = await self.store.get_agent(*key)
            if agent is None:
                raise NotFound(f"agent {run.agent_name} v{run.agent_version} not found")
            graph = self._graphs[key] = parse_agent(agent.definition)
        return graph


class _Drive:
    """One drive of one run: the state between journal commits."""

    def __init__(self, runner: Runner, run: Run, graph: Graph) -> None:
        self.r = runner
        self.run = run
        self.graph = graph
        self.lease = Lease(run.id, runner.worker_id, 0)  # the real one comes with execute()
        self.outputs: dict[str, Any] = {}
        self.attempts: dict[str, int] = {}
        self.tasks: dict[asyncio.Task[Any], str] = {}
        self.writer = EventWriter(run.id)
        self.final: RunUpdate | None = None  # the update that finished the run, once it has
        self._begun: list[tuple[str, int]] | None = None  # steps to spawn after begin()
        self.cancelled = asyncio.Event()  # set when a cancellation request is seen
        self._secrets: list[str] | None = None
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
                state = fold(await self.r.store.events(self.run.id, blobs=True))
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
        try:
            await self._loop()
        finally:
            for task in self.tasks:
                task.cancel()

    def _plan(
        self, state: RunState
    ) -> tuple[list[NewEvent], RunUpdate | None, list[tuple[str, int]]]:
        """The opening commit of this drive, and the steps to spawn once it is durable."""
        self.writer = EventWriter(self.run.id, state.last_seq, state.last_hash)
        self.outputs = dict(state.outputs)
        self.attempts = dict(state.attempts)
        events, update = self._opening(state)
        if update is not None and update.status in TERMINAL:
            return events, update, []
        resume = [(s, state.attempts[s]) for s in state.in_flight]
        fresh = self._ready()
        events += self._start(fresh)
        if interpreter.finished(self.graph, self.outputs):
            events, update = self._succeeded(events)
        return events, update, resume + [(s, 1) for s in fresh]

    def _opening(self, state: RunState) -> tuple[list[NewEvent], RunUpdate | None]:
        w = self.writer
        if state.started:
            metrics.RECOVERIES.inc()
            if state.recoveries >= self.r.max_recoveries:
                # A run that keeps killing its executor must not take the fleet down forever.
                error = {
                    "code": "recovery_exhausted",
                    "message": f"the run was recovered {state.recoveries} times; giving up",
                    "recoveries": state.recoveries,
                }
                return [w.event("run_failed", {"error": error})], RunUpdate("failed", error=error)
            recovered = w.event(
                "run_recovered",
                {
                    "fromWorker": state.worker,
                    "toWorker": self.r.worker_id,
                    "epoch": self.lease.epoch,
                    "attempt": state.recoveries + 1,
                    "replayed": sorted(state.outputs),
                    "inFlight": state.in_flight,
                },
            )
            tracing.recovered(self.run.id, self.graph, state, state.recoveries + 1)
            return [recovered], None
        trigger = self.graph.trigger
        self.outputs[trigger] = self.run.input
        self.attempts[trigger] = 1
        return [
            w.event("run_started", {"worker": self.r.worker_id}),
            # The trigger has no side effect, so it starts and completes in the first commit.
            w.event("step_started", {"type": "trigger"}, step_id=trigger, attempt=1),
            w.completed(trigger, 1, self.run.input),
        ], RunUpdate("running")

    def _ready(self) -> list[str]:
        started = self.attempts.keys() | self.outputs.keys()
        return interpreter.ready(self.graph, self.outputs, started)

    def _start(self, steps: Sequence[str]) -> list[NewEvent]:
        for s in steps:
            self.attempts[s] = 1
        return [
            self.writer.event(
                "step_started", {"type": self.graph.nodes[s].type}, step_id=s, attempt=1
            )
            for s in steps
        ]

    def _succeeded(self, events: list[NewEvent]) -> tuple[list[NewEvent], RunUpdate]:
        output = interpreter.run_output(self.graph, self.outputs)
        events.append(self.writer.event("run_succeeded", {"output": output}))
        return events, RunUpdate("succeeded", output=output)

    async def _loop(self) -> None:
        cancel = asyncio.ensure_future(self.cancelled.wait())
        try:
            await self._steps(cancel)
        finally:
            cancel.cancel()

    async def _cancel(self, events: list[NewEvent]) -> None:
        """Stop the steps in flight and journal the cancellation (with what did complete)."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()
        events.append(self.writer.event("run_cancelled", {"by": "request"}))
        await self._commit(events, RunUpdate("cancelled", error=CANCELLED))

    async def _steps(self, cancel: asyncio.Future[Any]) -> None:
        while self.tasks:
            await asyncio.wait([*self.tasks, cancel], return_when=asyncio.FIRST_COMPLETED)
            done = [task for task in self.tasks if task.done()]
            events: list[NewEvent] = []
            failure: tuple[str, StepError] | None = None
            for task in done:
                step = self.tasks.pop(task)
                attempt = self.attempts[step]
                exc = task.exception()
                if exc is not None and not isinstance(exc, StepError):
                    raise exc
                if exc is None:
                    try:
                        body = dumps(task.result())
                        problem = text_problem(body)
                        if problem is None:
                            # Downstream steps see exactly what a replay would read back.
                            output = json.loads(body)
                            # Canonical JSON (the hash chain) refuses what JSON cannot carry
                            # exactly, such as integers beyond 2^53.
                            events.append(self.writer.completed(step, attempt, output, body))
                            self.outputs[step] = output
                            continue
                    except (TypeError, ValueError) as err:
                        problem = f"it is not JSON: {err}"
                    exc = StepError(
                        f"step {step!r} returned a value the journal cannot store: {problem}",
                        error_class="tool",
                    )
                assert isinstance(exc, StepError)
                failure = failure or (step, exc)
                events.append(
                    self.writer.event(
                        "step_failed", {"error": exc.to_json()}, step_id=step, attempt=attempt
                    )
                )
            if failure is not None:
                step, exc = failure
                error = {"code": "step_failed", "step": step, **exc.to_json()}
                events.append(self.writer.event("run_failed", {"error": error}))
                await self._commit(events, RunUpdate("failed", error=error))
                return
            if not self.r.keeper.live(self.run.id):
                # Lost, or not renewed for a whole TTL (the database away): start nothing
                # more; whoever holds the run next re-drives it from the journal.
                raise LeaseLost(self.run.id, self.lease.epoch)
            if cancel.done():
                await self._cancel(events)
                return
            fresh = [] if self.r.stopping.is_set() else self._ready()
            events += self._start(fresh)
            update = None
            if interpreter.finished(self.graph, self.outputs):
                events, update = self._succeeded(events)
            await self._commit(events, update)
            for step in fresh:
                self._spawn(step, 1)

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
        )
        task = asyncio.ensure_future(observed(executor_for(node.type), ctx))
        self.tasks[task] = step

    async def _commit(self, events: list[NewEvent], update: RunUpdate | None) -> None:
        started = time.perf_counter()
        await self.r.store.append(Append(self.lease, tuple(events), update))
        metrics.JOURNAL_WRITE.observe(time.perf_counter() - started)
        self._committed(events, update)

    def _committed(self, events: list[NewEvent], update: RunUpdate | None) -> None:
        if update is not None and update.status in TERMINAL:
            self.final = update
        metrics.committed(events)
        for listener in self.r.app.commit_listeners:
            listener(self.run.id, events)
