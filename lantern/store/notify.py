"""The commit notifier: "run X's journal advanced to seq N", fired after each journal commit.

Every store owns one ``Notifier`` (``store.notifier``) and calls ``committed(run_id, seq)``
after a journal write has committed, so whatever waits on a run's journal (the SSE stream,
``?wait=`` long polls, the browser) wakes at once instead of polling. The PostgreSQL backend
relays the same notifications between replicas with ``LISTEN/NOTIFY``; SQLite notifies within
its process only.

A notification is a hint, never the data: a waiter always reads the journal itself after it
wakes. So a notification lost to a crash (the commit landed, the ``NOTIFY`` did not) or to a
dropped listening connection costs latency, not events. Wait with a timeout, and on a timeout
read the journal anyway: that is the safety net. The pattern that never misses a commit::

    with store.notifier.subscribe(run_id) as sub:   # subscribe first...
        while True:
            events = await store.events(run_id, after=seen)   # ...then read
            ...                                      # hand them on, seen = their last seq
            await sub.wait(seen, timeout=2.0)        # a commit after the read wakes this

A commit between the read and the wait is not lost: the subscription already saw it, so the
wait returns at once.

A notification also says whether the commit finished the run (``finished``), so a waiter for the
run's end (``GET /v1/runs/{id}?wait=``) sleeps through the commits of its steps and reads the run
once, when it ended (``Subscription.until_finished``), instead of once per commit.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from types import TracebackType

Publish = Callable[[str, int, bool], None]  # run id, seq, finished

RECENT = 10_000  # runs whose newest seq is remembered with no subscriber


class Subscription:
    """One waiter on one run. Use it as a context manager, or ``unsubscribe`` it when done."""

    def __init__(self, notifier: Notifier, run_id: str, seq: int, finished: bool) -> None:
        self.notifier = notifier
        self.run_id = run_id
        self.seq = seq  # the newest seq this subscription has heard of (0: none yet)
        self.finished = finished  # a commit that finished the run was heard of
        self._woken = asyncio.Event()
        self._poked = False
        self.stale = False  # set when notifications may have been missed: read afresh

    def _advance(self, seq: int, finished: bool) -> None:
        if finished and not self.finished:
            self.finished = True
            self._woken.set()
        if seq > self.seq:
            self.seq = seq
            self._woken.set()

    def poke(self) -> None:
        """End a ``wait`` now: the follower has something else to hand on (live text), or the
        notifier may have missed commits and every waiter should re-read its journal."""
        self._poked = True
        self._woken.set()

    # A timeout is part of the contract, not an error: the caller re-reads the journal then.
    async def wait(self, after: int, timeout: float | None = None) -> int:  # noqa: ASYNC109
        """Return once the run's journal is known to be past ``after``, or on a ``poke``, or
        when ``timeout`` seconds have passed: the newest seq heard of (``<= after`` unless
        the journal advanced). A commit or poke since the subscription was taken counts."""
        await self._until(lambda: self.seq > after, timeout)
        return self.seq

    async def until_finished(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Return once a commit that finished the run was heard of (True), or on a ``poke`` or
        when ``timeout`` seconds have passed (False unless it finished meanwhile)."""
        await self._until(lambda: self.finished, timeout)
        return self.finished

    async def _until(self, heard: Callable[[], bool], timeout: float | None) -> None:  # noqa: ASYNC109
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        # Everything that sets the flag runs on this loop, and nothing is awaited between
        # the check and the clear, so a wake-up is never lost.
        while not heard() and not self._poked:
            self._woken.clear()
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                break
            try:
                # A timeout scope, not wait_for: no task made per wait (every GET ?wait,
                # POST ?wait and stream follower waits here, usually several times a run).
                async with asyncio.timeout(left):
                    await self._woken.wait()
            except TimeoutError:
                break
        self._poked = False

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.notifier.unsubscribe(self)


class Notifier:
    """In-process fan-out of journal commits, with an optional relay to other replicas."""

    def __init__(self) -> None:
        self._subs: dict[str, set[Subscription]] = {}
        self._recent: OrderedDict[str, int] = OrderedDict()
        self._ended: OrderedDict[str, None] = OrderedDict()  # runs heard to have finished
        self._publish: Publish | None = None
        self._on_subscribe: Callable[[], None] | None = None
        # Whether this process drives the run now, so its commits are heard here without a
        # relay (a server sets its worker's); a run not known to be is driven elsewhere.
        self.driven_here: Callable[[str], bool] = lambda run_id: False

    def relay_to(self, publish: Publish | None, on_subscribe: Callable[[], None] | None) -> None:
        """Send this process's commits to the other replicas through ``publish``; call
        ``on_subscribe()`` at each subscription (a relay starts listening to its peers then)."""
        self._publish = publish
        self._on_subscribe = on_subscribe

    def subscribe(self, run_id: str) -> Subscription:
        if self._on_subscribe is not None:
            self._on_subscribe()
        sub = Subscription(self, run_id, self._recent.get(run_id, 0), run_id in self._ended)
        self._subs.setdefault(run_id, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.run_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.run_id]

    def followed_elsewhere(self) -> bool:
        """Whether a run followed here may be driven elsewhere: only then are the peers'
        commits needed here. Not one driven here, nor one heard to have finished (a
        ``GET ?wait`` of a finished run follows it for the moment its read takes)."""
        return any(not self.driven_here(r) and r not in self._ended for r in self._subs)

    def subscribers(self, run_id: str) -> int:
        return len(self._subs.get(run_id, ()))

    def latest(self, run_id: str) -> int:
        """The newest seq of the run this process has heard of recently (0: none)."""
        return self._recent.get(run_id, 0)

    async def wait(self, run_id: str, after: int, timeout: float) -> int:  # noqa: ASYNC109
        """Wait for the run's journal to pass ``after`` (see ``Subscription.wait``).

        Without a subscription taken before reading the journal, a commit that landed
        between the read and this call is caught only if it was recent (``latest``).
        """
        with self.subscribe(run_id) as sub:
            return await sub.wait(after, timeout)

    def committed(self, run_id: str, seq: int, finished: bool = False) -> None:
        """A journal write of this process committed (``finished``: it ended the run): wake
        local waiters, tell the peers."""
        self.advanced(run_id, seq, finished)
        if self._publish is not None:
            self._publish(run_id, seq, finished)

    def advanced(self, run_id: str, seq: int, finished: bool = False) -> None:
        """The run's journal reached ``seq`` (here, or on a peer: a relay calls this)."""
        known = self._recent.get(run_id)
        if known is None or seq > known:
            self._recent[run_id] = seq
        self._recent.move_to_end(run_id)
        if len(self._recent) > RECENT:
            self._recent.popitem(last=False)
        if finished:
            self._ended[run_id] = None
            if len(self._ended) > RECENT:
                self._ended.popitem(last=False)
        for sub in self._subs.get(run_id, ()):
            sub._advance(seq, finished)

    def resync(self) -> None:
        """Notifications may have been missed (a relay reconnected): wake every waiter to
        re-read its journal."""
        for subs in self._subs.values():
            for sub in subs:
                sub.stale = True
                sub.poke()
