"""A run stored by its own opening commit: the create of a run its replica drives at once.

``POST /v1/runs?wait=`` on a replica with a free slot used to write the run (queued, one
commit) and then, in its drive, lease it and journal its opening (a second commit). Written
together (``JournalStore.start_new_run``) it is one commit, and one fsync, fewer per run; a
SIGKILL after it leaves what the separate opening left (a running run, its lease, its
``run_started``), which the recovery sweep takes back once the lease expires.

The drive (``Drive.begin``, every kind driven in-process) writes the run with its opening;
its creator waits on ``stored`` for the run as stored (``running``, or ``queued`` when the
store declined to start it: a newer version than the drive was made for, or flow control,
whose slots only a claim counts), None when the drive never wrote it (it declined before
its commit: the creator then stores the run as any other), or the create's error (an
idempotency key's Conflict, an unknown agent, the database away, or, for a run the store
would have left queued, its workspace's full queue), nothing stored.

The queue limit (LANTERN_MAX_QUEUED_RUNS) bounds the runs waiting to start; a run started
at its create never waits, so its create pays no count of the queue: the store counts it
only when it stores the run queued after all, in that same transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from lantern.errors import StoreUnavailable
from lantern.store.base import Store
from lantern.store.records import FlowOf, Lease, NewEvent, Run, RunUpdate


@dataclass
class NewRun:
    """A run not yet stored, and how its create would store it (``create_run``'s request)."""

    run: Run  # its ``agent_version`` is the one its drive was made for
    idempotency_key: str | None
    request_digest: str
    flow: FlowOf
    max_queued: int | None = None  # the queue limit for the run if it is stored queued after all
    stored: asyncio.Future[Run | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    @property
    def created(self) -> bool:
        """Whether the run is in the store (written by this drive)."""
        return (
            self.stored.done()
            and not self.stored.cancelled()
            and self.stored.exception() is None
            and self.stored.result() is not None
        )

    def settle(self, run: Run | None) -> None:
        if not self.stored.done():
            self.stored.set_result(run)

    def fail(self, exc: BaseException) -> None:
        if isinstance(exc, asyncio.CancelledError):  # stopping: stored or not, nobody knows
            exc = StoreUnavailable("the server stopped while it created the run")
        if not self.stored.done():
            self.stored.set_exception(exc)
            self.stored.exception()  # the creator reads it; never "exception never retrieved"

    async def start(
        self,
        store: Store,
        worker_id: str,
        ttl: float,
        events: Sequence[NewEvent],
        update: RunUpdate,
    ) -> Lease | None:
        """Store the run with its opening (``start_new_run``), telling the creator; None
        when it was stored queued (to be taken as any other run)."""
        try:
            run, lease = await store.start_new_run(
                self.run,
                idempotency_key=self.idempotency_key,
                request_digest=self.request_digest,
                flow=self.flow,
                worker_id=worker_id,
                ttl=ttl,
                events=events,
                update=update,
                max_queued=self.max_queued,
            )
        except BaseException as exc:
            self.fail(exc)
            raise
        self.settle(run)
        return lease
