"""The tail of a run's journal, read once for every follower of the run in this process.

Two hundred browsers on one run must not mean two hundred journal queries per commit (nor
two hundred JSON encodings of each event): followers of a run share one ``Tail``, which keeps
the run's recent events, encoded once, and reads the journal for all of them with one query
at a time. A follower further behind than the tail keeps (one that resumes from an old seq)
reads the journal itself.
"""

from __future__ import annotations

import asyncio
import bisect
import json
from collections.abc import Iterator
from contextlib import contextmanager

from lantern.store.base import Store
from lantern.store.records import Event
from lantern.views import event_json

KEEP = 2000  # events a tail keeps


class Tail:
    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.followers = 0
        self._seqs: list[int] = []
        self._items: list[tuple[Event, str]] = []  # (event, its JSON as the stream sends it)
        self._reading: asyncio.Future[None] | None = None
        self._read_from = 0  # the seq after which the tail has read everything

    async def since(self, seen: int, known: int, *, reread: bool) -> list[tuple[Event, str]]:
        """The events after ``seen`` (with their JSON): at least through ``known`` when the
        notifier has heard of it, and with ``reread`` a fresh read of the journal (the
        safety net under the notifier)."""
        fresh_read = reread
        for _ in range(100):
            if not fresh_read and self._read_from >= max(known, seen + 1):
                break
            await self._read()
            fresh_read = False
            if self._read_from >= known:
                break
        if self._seqs and self._seqs[0] > seen + 1:
            # Behind what the tail keeps: this follower reads for itself.
            return [(e, _encoded(e)) for e in await self.store.events(self.run_id, after=seen)]
        start = bisect.bisect_right(self._seqs, seen)
        return self._items[start:]

    async def _read(self) -> None:
        """One read of the journal past what the tail has, shared by whoever asks meanwhile."""
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._fetch())
        reading = self._reading
        try:
            await asyncio.shield(reading)
        finally:
            if self._reading is reading and reading.done():
                self._reading = None

    async def _fetch(self) -> None:
        events = await self.store.events(self.run_id, after=self._read_from)
        for e in events:
            self._seqs.append(e.seq)
            self._items.append((e, _encoded(e)))
        if events:
            self._read_from = events[-1].seq
        if len(self._items) > KEEP:
            del self._items[:-KEEP]
            del self._seqs[:-KEEP]


def _encoded(event: Event) -> str:
    return json.dumps(event_json(event))


class Tails:
    """The tails of the runs followed in this process, each kept while someone follows it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._tails: dict[str, Tail] = {}

    @contextmanager
    def follow(self, run_id: str) -> Iterator[Tail]:
        tail = self._tails.get(run_id)
        if tail is None:
            tail = self._tails[run_id] = Tail(self.store, run_id)
        tail.followers += 1
        try:
            yield tail
        finally:
            tail.followers -= 1
            if tail.followers == 0 and self._tails.get(run_id) is tail:
                del self._tails[run_id]
