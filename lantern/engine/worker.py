"""A worker: one process's executor. It takes back its own runs on start, claims queued runs
under leases, recovers orphaned runs (the recovery sweep), drives them with bounded
concurrency, heartbeats, and on a clean stop lets steps in flight finish (within a grace
period) and releases its leases.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, contextmanager, suppress
from dataclasses import replace
from datetime import UTC, datetime

from lantern import config, outbound, threads
from lantern.app import App
from lantern.effects.egress import EgressPolicy, client
from lantern.engine.leases import LeaseKeeper
from lantern.engine.live import LiveText
from lantern.engine.new_run import NewRun
from lantern.engine.recovery import RecoveryLoop
from lantern.engine.runner import Runner
from lantern.engine.schedules import ScheduleLoop
from lantern.ids import new_run_id
from lantern.models.registry import Models
from lantern.secrets import box
from lantern.secrets.vault import Vault
from lantern.store.base import Store
from lantern.store.records import FlowOf, Lease, Run

log = logging.getLogger("lantern.worker")

HEARTBEAT = 5.0  # seconds between heartbeats, at most


class _Either:
    """Whether a run id is in either of two sets, as they are when asked (a claim asks after
    its query, so a create begun meanwhile is passed by too)."""

    def __init__(self, a: set[str], b: set[str]) -> None:
        self.a, self.b = a, b

    def __contains__(self, run_id: object) -> bool:
        return run_id in self.a or run_id in self.b


def _finished(task: asyncio.Task[object]) -> bool:
    """Whether a drive ended with its run finished (not parked, lost or failed to drive)."""
    if task.cancelled() or task.exception() is not None:
        return False
    run = task.result()
    return isinstance(run, Run) and run.finished


class Worker:
    def __init__(
        self,
        store: Store,
        app: App,
        *,
        worker_id: str,
        lease_ttl: float,
        max_concurrent: int = 256,
        poll_interval: float = 0.2,
        recovery_interval: float = 30.0,
        max_recoveries: int = 10,
        issue_receipt: Callable[[str], Awaitable[None]] | None = None,
        step_timeout: float | None = None,
        egress: EgressPolicy | None = None,
        vault: Vault | None = None,
        microvm: Callable[[Run, Lease], Awaitable[None]] | None = None,
        models: Models | None = None,
        tool_threads: int = config.DEFAULT_TOOL_THREADS,
        max_output_bytes: int | None = None,
    ) -> None:
        self.store = store
        # The largest step output journaled: read once (LANTERN_MAX_OUTPUT_BYTES), not per output.
        self.max_output_bytes = (
            config.max_output_bytes() if max_output_bytes is None else max_output_bytes
        )
        # The model configuration (routes, prices, budgets) the process's settings give; none
        # given: no routes, the shipped prices, no workspace budgets (and closed on exit).
        self.models = models if models is not None else Models()
        self._own_models = models is None
        self.tool_threads = tool_threads
        self.step_timeout = step_timeout
        self.microvm = microvm
        # Tenant URLs reach only public addresses and what LANTERN_EGRESS_ALLOW lists.
        self.egress = egress if egress is not None else EgressPolicy.parse(config.egress_allow())
        self._vault = vault
        self.issue_receipt = issue_receipt
        self.worker_id = worker_id
        self.max_concurrent = max_concurrent
        self.poll_interval = poll_interval
        self.keeper = LeaseKeeper(store, lease_ttl)
        self.stopping = asyncio.Event()
        self._stack = AsyncExitStack()
        self._app = app
        self.app = app  # the user's tools and code-first agents
        self._runs: set[asyncio.Task[object]] = set()
        self._driving: set[str] = set()  # the ids of those runs
        # Runs handed to a drive at their create (``take``), until that drive ends: a claim
        # of one of them meanwhile starts no second drive.
        self._taken: set[str] = set()
        # Ids of runs being created here to be taken (``creating``): committed queued before
        # ``take`` hands them on, so a claim would see them first.
        self._creating: set[str] = set()
        # A claim's lease on a taken run, kept until the create's drive ends: that drive may
        # already have parked the run (a follower sees the park before the drive is over),
        # and a decision's wake then claimed it; dropped, nobody drove the run until the
        # lease expired.
        self._claimed_meanwhile: dict[str, Lease] = {}
        # Runs may wait in the queue for a slot of this process: its last claim filled every
        # slot it asked for, or a create found none free. Only then does the end of a drive
        # started at a create call for a claim (see ``_done``).
        self._behind = False
        self._starting = _Either(self._creating, self._taken)
        self._wake = asyncio.Event()
        self.runner: Runner | None = None
        self.live = LiveText()  # the live text of the model steps this process runs
        self.max_recoveries = max_recoveries
        self.started_at = datetime.now(UTC)
        self.recovery = RecoveryLoop(
            store,
            worker_id=worker_id,
            ttl=lease_ttl,
            interval=recovery_interval,
            free_slots=lambda: self.max_concurrent - len(self._runs),
            start=self._recovered,
        )
        # Fires due schedules; a fire missed for longer than a recovery interval was missed
        # while every replica was down (the schedule's catchup decides).
        self.schedules = ScheduleLoop(store, grace=recovery_interval, app=app, on_fired=self.wake)

    async def __aenter__(self) -> Worker:
        self.keeper.start()  # its loops live as long as the worker
        outbound.configure(self.max_concurrent)
        threads.configure(self.tool_threads)
        http = await self._stack.enter_async_context(client(self.egress))
        self.runner = Runner(
            self.store,
            self._app,
            self.keeper,
            worker_id=self.worker_id,
            http=http,
            stopping=self.stopping,
            max_recoveries=self.max_recoveries,
            on_queued=self.wake,
            issue_receipt=self.issue_receipt,
            step_timeout=self.step_timeout,
            vault=self.vault,
            live=self.live,
            microvm=self.microvm,
            models=self.models,
            max_output_bytes=self.max_output_bytes,
        )
        return self

    def vault(self) -> Vault:
        """The vault given, else one over this store with the key the environment names
        (LANTERN_SECRETS_KEY or the data dir's key file), made when a step first needs it."""
        if self._vault is None:
            s = config.Settings.from_env()
            self._vault = Vault(self.store, box.load(s.secrets_key, s.data_path))
        return self._vault

    async def __aexit__(self, *exc: object) -> None:
        await self.keeper.close()
        await self._stack.aclose()
        if self._own_models:
            await self.models.aclose()  # their SDK clients, with the loop that opened them

    async def reclaim(self) -> int:
        """Take back at once the unfinished runs whose leases name this worker id."""
        run_ids = await self.store.runs_leased_by(self.worker_id)
        for run_id in run_ids:
            self._start(run_id, None)
        if run_ids:
            log.info("worker %s re-driving %d run(s) it held", self.worker_id, len(run_ids))
        return len(run_ids)

    async def serve(self) -> None:
        """Reclaim, then sweep for orphans and claim queued runs until ``stop()``."""
        await self.store.heartbeat(self.worker_id, self.started_at)
        await self.reclaim()
        background = [
            asyncio.create_task(self.recovery.run(self.stopping), name="lantern-recovery"),
            asyncio.create_task(self._heartbeats(), name="lantern-heartbeat"),
            asyncio.create_task(self.schedules.run(self.stopping), name="lantern-schedules"),
        ]
        if self.app.agents:
            background.append(asyncio.create_task(self._adopt(), name="lantern-adopt"))
        try:
            await self._dispatch()
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

    async def _heartbeats(self) -> None:
        every = min(self.keeper.ttl / 3, HEARTBEAT)
        while not self.stopping.is_set():
            with suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), every)
            try:
                await self.store.heartbeat(self.worker_id, self.started_at)
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)

    async def _adopt(self) -> None:
        """Take the code-first runs that replicas without their version left for one that
        has it: at start, then every recovery interval."""
        while not self.stopping.is_set():
            for agent in list(self.app.agents.values()):
                try:
                    found = await self.store.runs_waiting_for(agent.name, [agent.version])
                except Exception as exc:  # the database is away: the next pass tries again
                    log.warning("could not look for runs to adopt: %s", exc)
                    break
                driving = {t.get_name() for t in self._runs}
                fresh = [r for r in found if f"drive {r}" not in driving]
                for run_id in fresh[: max(0, self.max_concurrent - len(self._runs))]:
                    # Through the claim's decision: a run under flow control starts only
                    # when its key and its agent have a slot for it (else the next pass).
                    try:
                        lease = await self.store.claim_run(run_id, self.worker_id, self.keeper.ttl)
                    except Exception as exc:
                        log.warning("could not adopt run %s: %s", run_id, exc)
                        break
                    if lease is not None:
                        self._start(run_id, lease)
            with suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.recovery.interval)

    async def _dispatch(self) -> None:
        while not self.stopping.is_set():
            free = self.max_concurrent - len(self._runs)
            leases: list[Lease] = []
            if free > 0:
                try:
                    # Not the runs this process's creates are starting: taken here too (a
                    # lease their start then supersedes), they cost a write, a wait and a
                    # wasted renewal each, about a third of the runs created in a burst.
                    leases = await self.store.claim_runs(
                        self.worker_id, self.keeper.ttl, free, ("queued",), skip=self._starting
                    )
                except Exception as exc:  # the database is away: keep trying
                    log.warning("could not claim runs: %s", exc)
            self._behind = free <= 0 or len(leases) >= free
            for lease in leases:
                self._start(lease.run_id, lease)
            if not leases:
                self._wake.clear()
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_interval)

    def wake(self) -> None:
        """Look for queued runs now rather than at the next poll."""
        self._wake.set()

    @contextmanager
    def creating(self) -> Iterator[str]:
        """A new run's id, for a create whose run is then given to ``take``: until the block
        ends, this process's claims pass the run by."""
        run_id = new_run_id()
        self._creating.add(run_id)
        try:
            yield run_id
        finally:
            self._creating.discard(run_id)

    async def start_new(
        self,
        run: Run,
        idempotency_key: str | None,
        request_digest: str,
        flow: FlowOf,
        max_queued: int,
    ) -> Run | None:
        """Store ``run`` (being created here, not stored yet) with its lease and opening in
        one commit (``lantern.engine.new_run``) and drive it, when this process would take it
        at its create (``take``) and has driven its agent's newest version before (its drive
        is made for it). The run as stored (``running`` when started here; ``queued`` when the
        store declined, then for ``take``), or None when nothing was stored (the caller then
        stores it as any run). Raises what its create raised, with nothing stored: among it
        QueueFull, when the store declined and ``max_queued`` runs of the workspace were
        queued already."""
        assert self.runner is not None, "use the worker as an async context manager"
        version = self.runner.newest(run.workspace, run.agent_name)
        if version is None or not self._takes(run):
            return None
        new = NewRun(
            replace(run, agent_version=version),
            idempotency_key,
            request_digest,
            flow,
            max_queued,
        )
        self._taken.add(run.id)
        task = self._start(run.id, None, new=new)
        assert task is not None  # no lease: never deferred
        try:
            stored = await asyncio.shield(new.stored)
        except Exception:
            await asyncio.wait([task])  # its drive over, and let go (``_done``)
            raise
        if stored is None or stored.status == "queued":
            await asyncio.wait([task])  # as above: then handed on as any new run
        return stored

    def _takes(self, run: Run) -> bool:
        """Whether a run just created may be driven at once (``take``)."""
        return not (
            run.status != "queued"
            or run.flow is not None
            or run.cancel_requested
            or self.max_concurrent - len(self._runs) <= 0
            or self.stopping.is_set()
        )

    def take(self, run: Run) -> None:
        """A run this process just created: drive it now when a slot is free, with no round
        trip through the queue (no claim; its lease and opening commit are one transaction,
        as for any never-started run, and lose to a replica that claimed it first); else
        leave it to the dispatcher. Free slots mean no backlog here for the claim's
        fairness between workspaces to order. A run under flow control is left to the claim,
        which alone counts the slots its concurrency key and agent hold."""
        if run.status != "queued":
            return  # started (``start_new``), or an earlier run an idempotency key named
        if not self._takes(run):
            self._behind = self._behind or self.max_concurrent - len(self._runs) <= 0
            self.wake()
            return
        self._taken.add(run.id)
        self._start(run.id, None, run)

    def _recovered(self, run_id: str, lease: Lease) -> None:
        self._start(run_id, lease)

    def _start(
        self,
        run_id: str,
        lease: Lease | None,
        known: Run | None = None,
        held: bool = True,
        new: NewRun | None = None,
    ) -> asyncio.Task[object] | None:
        assert self.runner is not None, "use the worker as an async context manager"
        if lease is not None and run_id in self._taken:
            # Claimed while the drive its create started is under way: one drive, not two.
            # Driven when that one ends if the lease is still current: the run parked and
            # was woken since; a claim before that drive's opening was superseded by it (the
            # same worker id), and is let go without a drive.
            self._claimed_meanwhile[run_id] = lease
            return None
        task = asyncio.create_task(
            self._drive(run_id, lease, known, held, new), name=f"drive {run_id}"
        )
        self._runs.add(task)
        self._driving.add(run_id)
        task.add_done_callback(self._done)
        return task

    def drives(self, run_id: str) -> bool:
        """Whether a drive of this process has the run now: its commits are made here."""
        return run_id in self._driving

    def _done(self, task: asyncio.Task[object]) -> None:
        self._runs.discard(task)
        run_id = task.get_name().removeprefix("drive ")
        self._driving.discard(run_id)
        taken = run_id in self._taken
        self._taken.discard(run_id)
        claimed = self._claimed_meanwhile.pop(run_id, None)
        if claimed is not None and not self.stopping.is_set():
            self._start(run_id, claimed, held=False)
        if not (taken and _finished(task) and not self._behind):
            # A slot is free for a run the queue may hold: one this process had no slot for,
            # one of a flow group whose slot this run held (flow-controlled runs are only
            # ever claimed), a parked run's decision that came while it parked, a parent a
            # finished child made due. A run driven from its create to its end frees a slot
            # no queued run waited for: a claim then (one per run, under the claims' lock,
            # racing the creates it would see) found nothing but those creates' own runs.
            self._wake.set()
        self.recovery.slot_freed()

    async def _drive(
        self, run_id: str, lease: Lease | None, known: Run | None, held: bool, new: NewRun | None
    ) -> object:
        """``held`` False: ``lease`` waited for another drive of the run to end; driven only
        if it is still current (renewed here), as a claimed lease always is when started."""
        assert self.runner is not None
        try:
            if lease is not None and not held:
                if not await self.store.renew_lease(lease, self.keeper.ttl):
                    return None
            return await self.runner.drive(run_id, lease, known=known, new=new)
        except Exception:
            if new is not None and not new.created:
                return None  # its create failed: the creator has the error
            log.exception("run %s stopped on an error", run_id)
            return None

    async def stop(self, grace: float = 30.0) -> None:
        """Stop taking runs, let steps in flight finish within ``grace``, release leases."""
        self.stopping.set()
        self._wake.set()
        if self._runs:
            _, late = await asyncio.wait(self._runs, timeout=grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        with suppress(Exception):
            await self.store.worker_stopped(self.worker_id)
