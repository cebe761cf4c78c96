"""Issuing finished runs' receipts in the background, many to a write transaction.

A receipt stored in a transaction of its own cost every run a commit (and, on SQLite, an fsync)
on its critical path. Here the runner only hands the run's id over; a task of this process
signs whatever is pending and stores it in one transaction, so a run's waiter is answered
without waiting for its receipt and a burst of runs shares one commit.

A batch the database refuses (it is down, or failing over) stays pending and is tried again,
after a pause that doubles up to ``RETRY_MAX_S``, until it is stored. Nothing is lost that was
not lost before: a receipt still pending when the process dies, or when it stops while the
database still refuses, is issued by the first read of it (``Issuer.receipt``), and the store
keeps the first receipt stored for a run, so a read that issues one while the batch holds
another changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType

from lantern.receipts.issue import Issuer
from lantern.store.records import StoredReceipt

log = logging.getLogger("lantern.receipts")

MAX_BATCH = 200  # receipts to a transaction: bounds how long one holds the writer
# How long the first receipt of a batch waits for others: the finished run's waiters are
# answered first, and runs finishing close together share the commit. Short, as a receipt
# still pending when the process dies is issued only when it is read.
WINDOW_S = 0.05
RETRY_S = 0.5  # the first pause after the database refused a batch; it doubles from there
RETRY_MAX_S = 30.0


class ReceiptBatcher:
    """``async with`` it for the life of the process; ``submit`` is the runner's hook."""

    def __init__(self, issuer: Issuer) -> None:
        self.issuer = issuer
        self._pending: dict[str, None] = {}  # run ids, in the order they finished
        self._wake = asyncio.Event()
        self._stopping = False
        self._stopped = asyncio.Event()  # cuts a pause before a retry short
        self._task: asyncio.Task[None] | None = None

    async def submit(self, run_id: str) -> None:
        """Queue the receipt of a run that has just finished (returns at once)."""
        if self._task is None:  # not started, or stopped: issue it here, as before
            await self.issuer.after_finish(run_id)
            return
        self._pending[run_id] = None
        self._wake.set()

    async def __aenter__(self) -> ReceiptBatcher:
        self._task = asyncio.create_task(self._loop(), name="lantern-receipts")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop, having issued every receipt still pending."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        self._stopped.set()
        self._wake.set()
        await task

    async def _loop(self) -> None:
        pause = RETRY_S
        while True:
            await self._wake.wait()
            if not self._stopping:
                await asyncio.sleep(WINDOW_S)
            self._wake.clear()
            while self._pending:
                ids = list(self._pending)[:MAX_BATCH]
                for run_id in ids:
                    del self._pending[run_id]
                try:
                    await self._issue(ids)
                    pause = RETRY_S
                except Exception as exc:
                    if self._stopping:  # no retry on the way out: each is issued when read
                        log.warning(
                            "%d receipts not issued (each will be when read): %s", len(ids), exc
                        )
                        continue
                    log.warning(
                        "%d receipts not issued yet (trying again in %g s): %s",
                        len(ids),
                        pause,
                        exc,
                    )
                    self._pending.update(dict.fromkeys(ids))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopped.wait(), pause)
                    pause = min(pause * 2, RETRY_MAX_S)
            if self._stopping:
                return

    async def _issue(self, run_ids: list[str]) -> None:
        """Sign and store the batch's receipts; raises when the database refuses it."""
        # Two reads for the whole batch, not two for each run: the runs, then the journal
        # heads of those finished (a run deleted meanwhile is absent, and skipped).
        found = await self.issuer.store.get_runs(run_ids)
        runs = [found[i] for i in run_ids if i in found and found[i].finished]
        heads = await self.issuer.store.journal_heads([r.id for r in runs])
        signed: list[StoredReceipt] = []
        for run in runs:
            try:
                # Not looked up first: one a read issued meanwhile is kept by the store.
                signed.append(self.issuer.signed(run, *heads[run.id]))
            except Exception as exc:  # not the database's doing: a retry would fail alike
                log.warning(
                    "run %s: receipt not issued now (it will be when read): %s", run.id, exc
                )
        await self.issuer.store.put_receipts(signed)
