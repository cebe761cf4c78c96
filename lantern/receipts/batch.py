"""Issuing finished runs' receipts in the background, many to a write transaction.

A receipt stored in a transaction of its own cost every run a commit (and, on SQLite, an fsync)
on its critical path. Here the runner only hands the run's id over; a task of this process
signs whatever is pending and stores it in one transaction, so a run's waiter is answered
without waiting for its receipt and a burst of runs shares one commit.

Nothing is lost that was not lost before: a receipt still pending when the process dies is
issued by the first read of it (``Issuer.receipt``), and the store keeps the first receipt
stored for a run, so a read that issues one while the batch holds another changes nothing.
"""

from __future__ import annotations

import asyncio
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


class ReceiptBatcher:
    """``async with`` it for the life of the process; ``submit`` is the runner's hook."""

    def __init__(self, issuer: Issuer) -> None:
        self.issuer = issuer
        self._pending: dict[str, None] = {}  # run ids, in the order they finished
        self._wake = asyncio.Event()
        self._stopping = False
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
        self._wake.set()
        await task

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            if not self._stopping:
                await asyncio.sleep(WINDOW_S)
            self._wake.clear()
            while self._pending:
                ids = list(self._pending)[:MAX_BATCH]
                for run_id in ids:
                    del self._pending[run_id]
                await self._issue(ids)
            if self._stopping:
                return

    async def _issue(self, run_ids: list[str]) -> None:
        # Two reads for the whole batch, not two for each run: the runs, then the journal
        # heads of those finished (a run deleted meanwhile is absent, and skipped).
        try:
            found = await self.issuer.store.get_runs(run_ids)
            runs = [found[i] for i in run_ids if i in found and found[i].finished]
            heads = await self.issuer.store.journal_heads([r.id for r in runs])
        except Exception as exc:
            log.warning(
                "%d receipts not issued now (they will be when read): %s", len(run_ids), exc
            )
            return
        signed: list[StoredReceipt] = []
        for run in runs:
            try:
                # Not looked up first: one a read issued meanwhile is kept by the store.
                signed.append(self.issuer.signed(run, *heads[run.id]))
            except Exception as exc:
                log.warning(
                    "run %s: receipt not issued now (it will be when read): %s", run.id, exc
                )
        try:
            await self.issuer.store.put_receipts(signed)
        except Exception as exc:
            log.warning("%d receipts not issued now (they will be when read): %s", len(signed), exc)
