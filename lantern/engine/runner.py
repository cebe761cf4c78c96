"""The runner: drives one run under its lease, with the drive its kind of agent needs.

The journal discipline every drive follows (write-ahead ``step_started``, one fenced commit
per batch of finished steps, the recovery opening) is ``lantern.engine.drive``'s; a graph
agent's drive is ``graph_drive.GraphDrive`` and a plain agent's ``conversation.Conversation``.
The runner holds what drives of this process share (the store, the app, the lease keeper, the
HTTP client, the model providers) and is the ``DriveHost`` they see.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import httpx

from lantern.app import App
from lantern.engine import commits
from lantern.engine.anomalies import RetryRates
from lantern.engine.baselines import Baselines
from lantern.engine.code_agents import CodeSpec
from lantern.engine.conversation import Conversation
from lantern.engine.drive import Drive, under_lease
from lantern.engine.functions import FunctionDrive
from lantern.engine.graph import Graph, PlainAgent, parse_agent
from lantern.engine.graph_drive import GraphDrive
from lantern.engine.leases import LeaseKeeper
from lantern.engine.live import LiveText
from lantern.engine.microvm import MicroVmAgent
from lantern.engine.new_run import NewRun
from lantern.errors import NotFound, StoreUnavailable
from lantern.limits import MAX_OUTPUT_BYTES
from lantern.models.registry import Models
from lantern.observability import tracing
from lantern.secrets.vault import Vault
from lantern.store.base import Store
from lantern.store.records import Lease, Run

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
        models: Models,
        step_timeout: float | None = None,
        live: LiveText | None = None,
        vault: Callable[[], Vault] | None = None,
        microvm: Callable[[Run, Lease], Awaitable[None]] | None = None,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
    ) -> None:
        self.store = store
        self.max_output_bytes = max_output_bytes  # the largest step output journaled
        self.step_timeout = step_timeout  # a step's limit unless its node or agent sets one
        self._vault = vault  # made on first use: most runs never open a secret
        # A microVM run is not driven here: this hands it, with its lease, to the tier's
        # scheduler (resumeMicroVMRun). Without one the lease is let go for a replica that has.
        self.microvm = microvm
        self.live = live or LiveText()  # model steps' text as it is generated (not journaled)
        self.on_queued = on_queued  # a run was queued here (a child): look for work now
        self.issue_receipt = issue_receipt  # called with a run's id once it has finished
        self.max_recoveries = max_recoveries
        self.app = app
        self.keeper = keeper
        self.worker_id = worker_id
        self.http = http
        self.models = models  # the providers, routes, prices and budgets of model steps
        self.stopping = stopping or asyncio.Event()
        self._graphs: dict[tuple[str, str, int], Graph | PlainAgent | MicroVmAgent | CodeSpec] = {}
        # (workspace, agent) -> the newest version of it driven here, and that version when
        # it is driven in-process (``newest``).
        self._newest_seen: dict[tuple[str, str], int] = {}
        self._newest: dict[tuple[str, str], int] = {}
        self.retry_rates = RetryRates()
        self.write_health = commits.WriteHealth()  # readiness: are our commits landing?
        self.baselines = Baselines(store)  # anomaly baselines (the relay's VM runs share it)

    async def secret_values(self, workspace: str) -> dict[str, str]:
        """The workspace's secrets, opened, for a step that dispatches now."""
        if self._vault is None:
            return {}
        return await self._vault().values(workspace)

    async def baseline(self, workspace: str, agent: str) -> dict[str, list[Any]]:
        """Recent usage of the agent's steps, read at most once a minute per agent."""
        return await self.baselines.of(workspace, agent)

    async def drive(
        self,
        run_id: str,
        lease: Lease | None = None,
        *,
        known: Run | None = None,
        new: NewRun | None = None,
    ) -> Run | None:
        """Execute or re-drive a run; None when another worker holds it or ours was lost.

        ``lease``, when given, was won before this call (by a claim), so the run read here is
        current: a queued run then has no journal to read. ``known``: the run as its creator
        has it just now, so the first attempt need not read it (a never-started run's lease
        and opening commit check it again in their transaction). ``new``: the run is not
        stored yet; its opening commit stores it (``lantern.engine.new_run``), and its creator
        is told of it, or told None when this drive did not store it.
        """
        if lease is not None:
            # Renewed from now on: a busy replica may take a while to reach the first step,
            # and a lease that expired meanwhile would be stolen (even by our own sweep).
            self.keeper.hold(lease)
        try:
            return await self._drive_patiently(run_id, lease, new.run if new else known, new)
        finally:
            if lease is not None:
                self.keeper.drop(lease)  # whatever ended the drive, renew it no more
            if new is not None:
                new.settle(None)  # not stored by this drive: its creator stores it

    def newest(self, workspace: str, agent_name: str) -> int | None:
        """The agent's newest version this process has driven a run of, when that version
        is driven in-process (not a microVM's): the version a new run's drive is made for
        before the run is stored (the store starts it only if that is still the newest)."""
        return self._newest.get((workspace, agent_name))

    async def _drive_patiently(
        self, run_id: str, lease: Lease | None, known: Run | None, new: NewRun | None
    ) -> Run | None:
        deadline: float | None = None
        delay = commits.FIRST_DELAY
        while True:
            try:
                run, known = known or await self.store.get_run(run_id), None
                if run is None:
                    raise NotFound(f"run {run_id} not found")
                if run.finished:
                    return run  # re-driving a finished run invokes nothing and writes nothing
                with tracing.drive(run, self.worker_id):
                    result = await self._drive(run, lease, new)
                    tracing.drive_ended(result)
                    return result
            except StoreUnavailable as exc:
                if new is not None and not new.created:
                    raise  # nothing stored: its creator has the error
                new = None  # stored: driven again from the store, as any run
                # The database blinked outside a commit (a read, a delivery's claim), or for
                # longer than a commit waits. While the lease could still be ours, wait and
                # re-drive from the journal under a new epoch: the step in flight runs again
                # with its key, and nothing waits out a lease.
                now = time.monotonic()
                deadline = deadline or now + self.keeper.ttl
                if now + delay > deadline or self.stopping.is_set():
                    raise
                log.warning("run %s: %s; re-driving in %.2f s", run_id, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, commits.MAX_DELAY)
                if lease is not None:
                    self.keeper.drop(lease)  # the re-drive takes a new epoch
                lease = None

    async def _drive(self, run: Run, lease: Lease | None, new: NewRun | None) -> Run | None:
        agent = await self._graph(run)
        if isinstance(agent, MicroVmAgent):
            if new is not None:
                return None  # not stored: the runtime scheduler places it once it is
            return await self._hand_off(run, lease)
        graph = agent
        drive = await under_lease(self, run, lambda: _new_drive(self, run, graph), lease, new)
        if drive is None:
            return None
        final = drive.final
        if final is None:  # stopped early (a clean stop), or another worker had finished it
            return await self.store.get_run(run.id)
        # The commit that finished the run released its lease in the same transaction.
        if self.issue_receipt is not None:
            await self.issue_receipt(run.id)
        return replace(
            run,
            status=final.status,
            output=final.output,
            error=final.error,
            updated_at=datetime.now(UTC),
        )

    async def _hand_off(self, run: Run, lease: Lease | None) -> Run | None:
        if lease is None:
            lease = await self.store.acquire_lease(run.id, self.worker_id, self.keeper.ttl)
            if lease is None:
                return None
        if self.microvm is None:
            await self.store.release_lease(lease)
        else:
            await self.microvm(run, lease)
        return await self.store.get_run(run.id)

    async def _graph(self, run: Run) -> Graph | PlainAgent | MicroVmAgent | CodeSpec:
        key = (run.workspace, run.agent_name, run.agent_version)
        graph = self._graphs.get(key)
        if graph is None:
            agent = await self.store.get_agent(*key)
            if agent is None:
                raise NotFound(f"agent {run.agent_name} v{run.agent_version} not found")
            code = CodeSpec.of(agent.definition)  # a code-first agent's stored version
            graph = self._graphs[key] = code or parse_agent(agent.definition, self.models.routes)
            named = key[:2]
            if run.agent_version >= self._newest_seen.get(named, 0):
                self._newest_seen[named] = run.agent_version
                if isinstance(graph, MicroVmAgent):
                    self._newest.pop(named, None)
                else:
                    self._newest[named] = run.agent_version
        return graph


def _new_drive(runner: Runner, run: Run, agent: Graph | PlainAgent | CodeSpec) -> Drive:
    """The drive for the run's kind of agent: each decides only what runs next."""
    if isinstance(agent, CodeSpec):
        return FunctionDrive(runner, run, agent)
    if isinstance(agent, PlainAgent):
        return Conversation(runner, run, agent)
    return GraphDrive(runner, run, agent)
