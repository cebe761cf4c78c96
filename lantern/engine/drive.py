"""The journal discipline, declared once: what every kind of run does to be durable.

A *drive* is one execution of one run under its lease, from the journal to the run's end or
to a stop. How a run decides what to do next differs by kind (a graph's ``interpreter.plan``,
a plain agent's ``turns.next_action``, a code-first function's own control flow, a microVM
workload's reports); how it journals what it does does not, and lives here:

- **Opening from the journal** (``execute``): fold the journal (one read, with blobs), serve
  the completed steps from it, and open with ``run_started`` (a new run, leased and opened in
  one transaction by ``begin``), ``run_resumed`` (woken from a park) or the recovery opening
  (``run_recovered``, or ``run_failed`` with ``recovery_exhausted`` for a run that keeps
  killing its executors). A recovery gives every replayed step its zero-length span.
- **The fenced commit** (``commit``): one ``Append`` under the lease's epoch, its latency in
  ``lantern_journal_write_seconds``, its events counted by kind, the anomaly detector fed, the
  keeper told when the commit gave the lease up, and the app's commit listeners called.
- **Steps**, decided by the run's step ledger (``self.ledger``, ``lantern.engine.ledger``:
  pure, folded from the journal and from every event this drive makes): ``start`` journals
  ``step_started`` (write-ahead: before the step is invoked); ``perform`` runs the step's
  work as a task through ``observed`` (its span, current while it runs so ``traceparent``
  rides on its requests; its duration and model usage) within its step timeout, anything
  its work raises but a store failure made the attempt's StepError (``ledger.step_error``,
  the one mapping every kind of run uses); ``settle``
  asks the ledger what the attempt's outcome makes: its output (exactly what a replay reads
  back, or a failure when the journal cannot store it), a retry with its due time
  (``step_retrying``, which survives a crash; ``backoff`` waits it out) or the step's
  failure; ``run_failed``, ``step_ended_run``, ``succeeded`` and ``cancel`` end the run.
  ``attempts`` is the one retry loop of a step run one attempt after another (a plain
  agent's turn, a code-first step, a microVM's model or tool call): wait out a due retry,
  journal the start, perform, settle, again while the ledger says retry; each kind says how
  it journals (``Attempts``). A graph settles concurrent steps in batches, so its retries
  wait on timers between batches (``GraphDrive``), deciding through the same ledger.
  ``key`` and ``deliveries`` give a step attempt its idempotency key and its claimed
  deliveries, fenced by the drive's lease. A rate limit's wait (``step_throttled``) is not
  waited out under the lease: when the ledger says it parks (``ledger.parks``), the drive
  commits ``parked_until(due)`` (the run ``waiting``, its lease and slot given up) and stops;
  the dispatcher of any replica claims it at the due time, as it does a timer's.
- **Anomalies** (``anomalies``): the detector finds them, the ledger journals them and
  applies each policy (record; fail the run; pause at an implicit approval
  ``anomaly:<kind>`` for kinds of run that can park, recorded only for the others).
- **The lease** (``under_lease``): won with the opening commit or by a claim, renewed by the
  keeper (which also sees a cancellation request) while the drive executes, handed on at once
  on a clean stop; ``ensure_live``: a lost or unrenewed lease stops the drive before it
  starts anything more, and the next holder re-drives from the journal.

Extension surface (how a new kind of run plugs in): subclass ``Drive`` and implement

- ``step_type(step)``: the step's type for spans and metrics (``lantern.node_type``);
- ``plan(state)``: called once the opening events are made (``self.ledger`` holds the
  journal's view; ``self.outputs``, ``self.attempts`` and ``self.waiting`` read it):
  journal the steps this drive starts first (``self.start``) and return ``(events,
  update)``, ``update`` being the run's end when it ends at once;
- ``proceed()``: run from there to the end (``self.final`` set by the commit that ended the
  run) or to a stop, using the primitives above and nothing else to touch the journal;

optionally ``opening_steps()`` (events a fresh run journals right after ``run_started``, such
as a graph's trigger). Pass ``can_pause=False`` when the kind has nowhere to park. Then let
``Runner`` pick the new drive for its kind of agent (``runner._new_drive``).

A code-first function's drive (``ctx.step(name, fn)``) asks ``ledger.enter`` what to do
(replay, raise, run attempt k with its key, wait out a due retry, nondeterminism), then
``commit([start(...)])``, ``perform(...)`` and ``settle(...)``. A microVM workload's drive
turns each step the VM reports into the same calls, so a VM never writes the journal itself
and every kind of run gets the same spans, counters, fencing and recovery. ``DriveHost`` is
all a drive knows of the process it runs in, so no drive imports the runner (import-linter
checks it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from lantern.app import App
from lantern.effects.claims import Deliveries
from lantern.engine import commits
from lantern.engine import events as ev
from lantern.engine.anomalies import Detector, RetryRates
from lantern.engine.cancel import finish_if_free
from lantern.engine.commits import WriteHealth
from lantern.engine.journal import RunState, recovery
from lantern.engine.leases import LeaseKeeper
from lantern.engine.ledger import Exit, Ledger, Retry, Usage, no_usage, step_error
from lantern.engine.live import LiveText
from lantern.engine.new_run import NewRun
from lantern.engine.retries import RetryPolicy
from lantern.errors import LeaseLost, StepError, StoreError
from lantern.models.budget import Budget
from lantern.models.registry import Models
from lantern.nodes.base import Noted
from lantern.observability import metrics, tracing
from lantern.store.base import Store
from lantern.store.records import TERMINAL, Append, Lease, NewEvent, Run, RunUpdate


class DriveHost(Protocol):
    """What a drive uses of the process that runs it (the ``Runner`` is one)."""

    store: Store
    app: App
    keeper: LeaseKeeper
    write_health: WriteHealth  # whether this process's commits are landing (readiness)
    worker_id: str
    http: httpx.AsyncClient
    models: Models
    stopping: asyncio.Event
    max_recoveries: int
    retry_rates: RetryRates
    live: LiveText  # model steps' text as it is generated, for followers (never journaled)
    step_timeout: float | None  # a step's limit unless its node or agent sets one
    max_output_bytes: int  # the largest output the journal takes (LANTERN_MAX_OUTPUT_BYTES)

    def on_queued(self) -> None:
        """A run was queued here (a child): look for work now."""

    async def baseline(self, workspace: str, agent: str) -> dict[str, list[Any]]:
        """Recent usage of the agent's steps and whole runs (anomaly baselines)."""
        ...

    async def secret_values(self, workspace: str) -> dict[str, str]:
        """The workspace's secrets, opened, for a step that dispatches now (docs/security.md)."""
        ...


log = logging.getLogger("lantern.runner")


class Attempts(Protocol):
    """How one kind of run journals the attempts of one step (``attempts``)."""

    async def backoff(self, due_ms: int) -> bool:
        """Wait until a retry is due (epoch ms); False: stop instead (a cancel, a clean stop)."""
        ...

    async def ready(self, attempt: int, start: bool) -> None:
        """Before the attempt runs: journal its ``step_started`` when ``start`` (write-ahead)."""

    async def attempt(self, attempt: int) -> Any:
        """Run the attempt: its value, or the StepError it failed with."""

    async def settled(self, attempt: int, outcome: Any) -> Exit:
        """The ledger's exit for the attempt's outcome, its events journaled (or queued for
        the kind's next commit)."""
        ...


async def attempts(io: Attempts, attempt: int, due_ms: int | None, start: bool) -> Exit | None:
    """The one retry loop: from attempt ``attempt`` (due at ``due_ms`` when a retry's backoff
    is still to wait out; ``start``: its start is not journaled yet) until the ledger says
    completed or failed, each retry waiting until its journaled due time; None when
    ``io.backoff`` stopped it."""
    while True:
        if due_ms is not None and not await io.backoff(due_ms):
            return None
        await io.ready(attempt, start or due_ms is not None)
        done = await io.settled(attempt, await io.attempt(attempt))
        if not isinstance(done.next, Retry):
            return done
        attempt, due_ms, start = done.next.attempt, done.next.due_ms, True


def parked_until(due_ms: int, other: datetime | None = None) -> RunUpdate:
    """The run update that parks a run until ``due_ms`` (epoch ms), or until ``other`` (a
    parked wait's timeout) when that comes first: it gives the lease (and the run's slot) up
    in the commit that carries it."""
    due = datetime.fromtimestamp(due_ms / 1000, UTC)
    return RunUpdate("waiting", wake_at=due if other is None else min(due, other))


async def under_lease(
    host: DriveHost,
    run: Run,
    new_drive: Callable[[], Drive],
    lease: Lease | None,
    new: NewRun | None = None,
) -> Drive | None:
    """Execute a drive of ``run`` under its lease: won here (a never-started run leases and
    opens in one transaction), or ``lease``, won before by a claim (so the run read is current
    and a queued run has no journal to read). The keeper renews the lease and watches for a
    cancellation while the drive executes; a clean stop hands the lease on at once. The
    drive, which says how it ended (``final`` None: stopped early); None when another worker
    holds the run or ours was lost. ``new``: ``run`` is not stored yet; the opening commit
    stores it (``lantern.engine.new_run``), and None when it did not start it here."""
    drive = new_drive()
    known_empty = lease is not None and run.status == "queued"
    if lease is None and run.status == "queued" and not run.cancel_requested:
        # Lease and opening commit in one transaction: one commit fewer per run.
        drive.new = new
        lease = await drive.begin()
        if lease is None:
            if new is not None:
                return None  # left queued, or never stored: its creator hands it on
            drive = new_drive()
    if lease is None:
        lease = await host.store.acquire_lease(run.id, host.worker_id, host.keeper.ttl)
        if lease is None:
            return None
    host.keeper.hold(lease, drive.cancelled.set)
    try:
        await drive.execute(lease, RunState() if known_empty else None)
    except LeaseLost as exc:
        log.warning("%s", exc)
        return None
    except asyncio.CancelledError:
        # A clean shutdown cut the run short: hand it on at once rather than after the TTL.
        await asyncio.shield(_hand_on(host, lease))
        raise
    except Exception as exc:
        # A drive that died of anything never leaves its run ``running`` under a lease
        # nobody acts on: a bug ends the run failed, a store failure hands it on to be
        # re-driven from the journal.
        log.exception("run %s: its drive stopped on an error", run.id)
        if not await drive.stranded(exc):
            await asyncio.shield(_hand_on(host, lease))
        return drive
    finally:
        host.keeper.drop(lease)
    if drive.final is None:  # the commit that finishes a run releases its lease itself
        await _hand_on(host, lease)
        # A cancel that came after the keeper's last look found the lease held, so it left
        # the run to us; the run then parked or stopped and gave the lease up. Finish it here
        # (its flag was set before the cancel tried the lease, so it is seen now).
        if await host.store.cancel_requested([run.id]):
            await finish_if_free(host.store, run.id, host.worker_id, host.keeper.ttl)
    return drive


async def _hand_on(host: DriveHost, lease: Lease) -> None:
    """Give the lease up now, for the sweep of any replica to hand the run on; after a renewal
    of it in flight, which would otherwise take it again for a whole TTL."""
    await host.keeper.let_go(lease)
    await host.store.release_lease(lease)


class Drive(ABC):
    """One drive of one run: the journal discipline; subclasses decide what runs next."""

    def __init__(
        self,
        host: DriveHost,
        run: Run,
        *,
        anomalies: Mapping[str, dict[str, Any]],
        can_pause: bool,
        budget: Mapping[str, Any] | None = None,
    ) -> None:
        self.host = host
        self.run = run
        self.lease = Lease(run.id, host.worker_id, 0)  # the real one comes with execute()
        self.budget = Budget.from_json(budget)  # the agent's: its model calls' limit
        # What the journal holds and what follows from it (built again at the opening).
        self.ledger = self.new_ledger()
        self.final: RunUpdate | None = None  # the update that finished the run, once it has
        self.cancelled = asyncio.Event()  # set when a cancellation request is seen
        self._opened = False  # begin() journaled the opening
        self.new: NewRun | None = None  # the run, when begin() is to store it (new_run.py)
        if not can_pause:  # nowhere to park: a "pause" policy is recorded, not applied
            anomalies = {
                k: {**v, "policy": "fail" if v["policy"] == "fail" else "record"}
                for k, v in anomalies.items()
            }
        self.can_pause = can_pause
        self.detector = Detector(run.workspace, dict(anomalies), host.retry_rates, self._baseline)
        if run.cancel_requested:
            self.cancelled.set()

    # The ledger's view, by the names every drive uses.

    @property
    def outputs(self) -> dict[str, Any]:
        return self.ledger.outputs

    @property
    def attempts(self) -> dict[str, int]:
        """step -> the attempt last started."""
        return self.ledger.attempts

    @property
    def waiting(self) -> dict[str, dict[str, Any]]:
        """Parked steps: their step_waiting data."""
        return self.ledger.waiting

    # -- what a kind of run decides --------------------------------------------------------

    @abstractmethod
    def step_type(self, step: str) -> str:
        """The step's type in spans and metrics (a node type, ``llm``, ``tool``, ...)."""

    @abstractmethod
    def plan(self, state: RunState) -> tuple[list[NewEvent], RunUpdate | None]:
        """The steps this drive starts first (journaled with ``start``), or the run's end."""

    @abstractmethod
    async def proceed(self) -> None:
        """Run from the opening to the run's end or to a stop."""

    def opening_steps(self) -> list[NewEvent]:
        """Events a fresh run journals right after ``run_started``."""
        return []

    # -- opening ---------------------------------------------------------------------------

    def new_ledger(self, journal: Iterable[Any] = ()) -> Ledger:
        """The run's ledger folded from ``journal`` (events), under the agent's budget and
        this process's output limit."""
        return Ledger.fold(
            self.run.id, journal, budget=self.budget, max_output=self.host.max_output_bytes
        )

    async def begin(self) -> Lease | None:
        """Lease a never-started run and journal its opening, in one transaction."""
        self.ledger = self.new_ledger()
        events, update = self._open()
        lease = await commits.start(
            self.host.store,
            self.run.id,
            self.host.worker_id,
            self.host.keeper.ttl,
            events,
            update or RunUpdate("running"),
            self.new,
        )
        if lease is not None:
            self.lease = lease
            self._committed(events, update)
            self._opened = True
        return lease

    async def execute(self, lease: Lease, state: RunState | None) -> None:
        """Drive from the journal (``state`` None: read it) to the end, or to a stop."""
        self.lease = lease
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
            events, update = self._open()
            await self.commit(events, update)
        if self.final is None:
            await self.proceed()

    def _open(self) -> tuple[list[NewEvent], RunUpdate | None]:
        """The opening events for the journal the ledger holds, and the steps ``plan`` starts
        (planned from the journal as it was, before the opening)."""
        w = self.ledger
        state = w.state
        update: RunUpdate | None
        if state.started and self.run.status == "waiting":
            # Woken from a park (a decision, a child's end, a timeout): not a recovery.
            events = [w.event(ev.RUN_RESUMED, {"worker": self.host.worker_id})]
            update = RunUpdate("running")
        elif state.started:
            metrics.RECOVERIES.inc()
            before, recoveries = state.worker, state.recoveries  # the event folds in below
            replayed = [
                (s, self.step_type(s), state.attempts.get(s, 1)) for s in sorted(state.outputs)
            ]
            event, failed = recovery(
                w, state, self.host.worker_id, self.lease.epoch, self.host.max_recoveries
            )
            if failed is not None:
                return [event], failed
            tracing.recovered(replayed, before, recoveries + 1)
            events, update = [event], None
        else:
            events = [w.event(ev.RUN_STARTED, {"worker": self.host.worker_id})]
            events += self.opening_steps()
            update = RunUpdate("running")
        more, end = self.plan(state)
        return events + more, end or update

    # -- the fenced commit -----------------------------------------------------------------

    async def commit(self, events: Sequence[NewEvent], update: RunUpdate | None = None) -> None:
        """Append ``events`` (and ``update``) under the lease: durable, or LeaseLost."""
        # THE fenced commit (lantern.engine.commits), sent again across a database blink for
        # up to a lease TTL; then what a drive adds.
        if update is not None and update.releases:
            # Before it is sent: a renewal in flight may find the lease given up before this
            # drive is back to drop it, and must not take that for a take-over.
            self.host.keeper.releasing(self.lease)
        await commits.commit(
            self.host.store,
            Append(self.lease, tuple(events), update),
            patience=self.host.keeper.ttl,
            health=self.host.write_health,
            listeners=self.host.app.commit_listeners,
            run=self.run,
        )
        self._noted(events, update)

    def _committed(self, events: Sequence[NewEvent], update: RunUpdate | None) -> None:
        batch = Append(self.lease, tuple(events), update)
        commits.committed(batch, self.host.app.commit_listeners, self.run)
        self._noted(events, update)

    def _noted(self, events: Sequence[NewEvent], update: RunUpdate | None) -> None:
        self.detector.replay(events)
        if update is not None and update.releases:
            self.host.keeper.drop(self.lease)  # given up with this commit: renew it no more
        if update is not None and update.status in TERMINAL:
            self.final = update

    async def stranded(self, exc: Exception) -> bool:
        """End the run failed after its drive died of ``exc``; False when it cannot (the
        store is away, the lease gone, the run already ended): then the caller hands it on."""
        if self.final is not None or isinstance(exc, StoreError):
            return self.final is not None
        message = " ".join(f"{type(exc).__name__}: {exc}".split())
        event, failed = self.run_failed(ev.run_error(ev.E_INTERNAL, message))
        try:
            await self.commit([event], failed)
        except Exception as again:
            log.warning("run %s: could not fail it after its drive stopped: %s", self.run.id, again)
            return False
        return True

    def ensure_live(self) -> None:
        """Start nothing more once the lease is lost, or not renewed for a whole TTL (the
        database away): whoever holds the run next re-drives it from the journal."""
        if not self.host.keeper.live(self.run.id):
            raise LeaseLost(self.run.id, self.lease.epoch)

    # -- steps -----------------------------------------------------------------------------

    def start(self, step: str, attempt: int, data: Mapping[str, Any] | None = None) -> NewEvent:
        """``step_started`` of ``(step, attempt)``; commit it before the step is invoked."""
        return self.ledger.start(
            step, attempt, {"type": self.step_type(step)} if data is None else data
        )

    def key(self, step: str, attempt: int) -> str:
        return self.ledger.key(step, attempt)

    def deliveries(self, step: str, attempt: int) -> Deliveries:
        """The claimed deliveries of one step attempt, fenced by this drive's lease."""
        return Deliveries(
            self.host.store,
            self.lease,
            step_id=step,
            attempt=attempt,
            idempotency_key=self.key(step, attempt),
        )

    def perform(
        self, step: str, attempt: int, work: Awaitable[Any], timeout: float | None = None
    ) -> asyncio.Task[Any]:
        """The step attempt's work as a task (``performed``): observed, cancelled past
        ``timeout`` seconds, failing with the attempt's StepError."""
        return performed(work, step, self.step_type(step), attempt, timeout)

    def settle(
        self,
        step: str,
        attempt: int,
        outcome: Any,
        policy: RetryPolicy,
        usage: Usage = no_usage,
    ) -> Exit:
        """How a step attempt ended (its value or a StepError), decided by the ledger: its
        ``step_completed`` (the output exactly as a replay reads it back, or a failure when
        the journal cannot store it), ``step_retrying`` with when the next attempt is due
        (which survives a crash) or ``step_failed`` when the policy gives up."""
        return self.ledger.exit(step, attempt, outcome, policy, usage=usage)

    async def backoff(self, due_ms: int, halt: asyncio.Event | None = None) -> bool:
        """Wait out a retry's backoff until its journaled due time (after a crash too);
        False when a cancellation request (or ``halt``) came first."""
        stops = [self.cancelled] if halt is None else [self.cancelled, halt]
        waits = [asyncio.ensure_future(e.wait()) for e in stops]
        try:
            await asyncio.wait(waits, timeout=max(0.0, due_ms / 1000 - time.time()))
        finally:
            for w in waits:
                w.cancel()
        return not any(e.is_set() for e in stops)

    # -- the run's end ---------------------------------------------------------------------

    def succeeded(self, output: Any) -> tuple[NewEvent, RunUpdate]:
        return self.ledger.succeeded(output)

    def run_failed(self, error: dict[str, Any]) -> tuple[NewEvent, RunUpdate]:
        return self.ledger.run_failed(error)

    def step_ended_run(self, step: str, error: StepError) -> tuple[NewEvent, RunUpdate]:
        """The run fails because ``step`` failed for good."""
        return self.ledger.step_ended_run(step, error)

    async def cancel(
        self,
        events: list[NewEvent],
        tasks: Iterable[asyncio.Future[Any]] = (),
        uninterruptible: Sequence[str] = (),
    ) -> None:
        """Stop the work in flight and journal the cancellation (with what did complete).

        ``uninterruptible`` names the steps the cancellation had to wait for: a sync tool runs
        in a thread, which Python cannot interrupt, so its return was the step boundary where
        the run stopped; ``run_cancelled`` says so."""
        stopping = list(tasks)
        for task in stopping:
            task.cancel()
        await asyncio.gather(*stopping, return_exceptions=True)
        event, update = self.ledger.cancelled(uninterruptible)
        await self.commit([*events, event], update)

    def waits_for_thread(self, steps: Sequence[str]) -> None:
        """Say, in the log, that a cancellation waits for sync tools running in threads."""
        log.warning(
            "run %s: cancel requested while sync tool step(s) %s run in a thread, which"
            " cannot be interrupted; the run stops when they return",
            self.run.id,
            ", ".join(sorted(steps)),
        )

    # -- anomalies -------------------------------------------------------------------------

    async def anomalies(
        self, events: list[NewEvent], starting: Sequence[str]
    ) -> tuple[RunUpdate | None, bool]:
        """Journal (into ``events``) the anomalies that ``events`` and the steps about to
        start (their signatures) raise, applying each policy: the run's failure when one
        fails it, and whether one paused it (an implicit approval ``anomaly:<kind>``)."""
        found = await self.detector.check(events, starting)
        more, error, paused = self.ledger.anomalies(found, can_pause=self.can_pause)
        events += more
        if error is None:
            return None, paused
        event, failed = self.run_failed(error)  # the run's end is the commit's last event
        events.append(event)
        return failed, False

    async def _baseline(self) -> Mapping[str, Sequence[Mapping[str, Any]]]:
        return await self.host.baseline(self.run.workspace, self.run.agent_name)


async def observed(work: Awaitable[Any], step: str, step_type: str, attempt: int) -> Any:
    """One step attempt, observed: its span (current while the work runs, so ``traceparent``
    rides on its requests), its duration, and the model usage its answer names."""
    span = tracing.start_step(step, step_type, attempt)
    started = time.perf_counter()
    try:
        output = await work
    except BaseException as exc:
        metrics.step_duration(step_type, time.perf_counter() - started)
        if span is not None:
            span.failed(exc)
        raise
    metrics.step_duration(step_type, time.perf_counter() - started)
    answer = output.value if isinstance(output, Noted) else output  # a gated answer
    metrics.model_usage(answer)
    if span is not None:
        span.succeeded(answer)
    return output


def performed(
    work: Awaitable[Any], step: str, step_type: str, attempt: int, timeout: float | None = None
) -> asyncio.Task[Any]:
    """One step attempt's work as a task, for every drive (a microVM's too): observed, cut
    at ``timeout`` seconds, and raising the attempt's StepError (``ledger.step_error``) for
    anything its preparation or work raised (a template naming a missing secret, a bug in a
    node, the user's code), so nothing a step does stops the drive; only a store failure (a
    lost lease) and a cancellation go through as they are."""
    if timeout is not None:
        work = _within(work, timeout, step)
    return asyncio.ensure_future(observed(_failing(work), step, step_type, attempt))


async def _failing(work: Awaitable[Any]) -> Any:
    try:
        return await work
    except (StepError, StoreError):
        raise
    except Exception as exc:
        raise step_error(exc) from exc


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
