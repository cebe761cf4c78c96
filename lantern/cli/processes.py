"""`lantern serve --workers N`: N replicas, each a process of its own, on one listening socket.

One process runs Python on one core at a time (the GIL), so one `lantern serve` tops out near
one core however many runs it is given. Each worker here is a whole replica, as a second
`lantern serve` would be (API, dispatcher, lease keeper; worker id ``ID-k``): the workers share
runs the way replicas do, through the database's claims, leases and LISTEN/NOTIFY, and none of
them depends on this parent. The parent binds the socket, forks the workers, starts again one
that dies (with its id, so it takes its runs back at once), and passes a stop on to them.

Forked, not spawned: the user's app is imported and the settings checked once, here, and each
worker starts from that, building its own app, store and threads after the fork.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("lantern")

NEVER_STARTED = 3  # a worker's exit code when its server did not start: the parent gives up
# A worker that dies is started again after a pause: 1 s, doubled for each death soon after a
# start (up to 30 s), so a worker that keeps crashing neither spins nor floods the log; back to
# 1 s for one that had been up a minute.
RESTART_PAUSE_S = 1.0
MAX_PAUSE_S = 30.0
STABLE_S = 60.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h: the signal a process gets when its parent dies


def worker_id(base: str, index: int) -> str:
    return f"{base}-{index}"


def _stop_with(parent: int) -> None:
    """A worker whose parent is killed (SIGKILL runs no handler) stops cleanly rather than
    serve on, unsupervised, on a port a restarted parent could not bind."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def supervise(count: int, child: Callable[[int], int]) -> int:
    """Run ``child(k)`` for k = 1..count, each in a forked process, until a SIGTERM or SIGINT,
    which each worker is sent on; a worker that exits otherwise is started again. 0 when
    every worker stopped cleanly, 1 otherwise (one did not start, or failed its stop)."""
    children: dict[int, int] = {}  # pid -> worker index
    started: dict[int, float] = {}  # worker index -> when it was last started (monotonic)
    pauses: dict[int, float] = {}  # worker index -> the pause before its next start
    stopping = False
    failed = False
    parent = os.getpid()

    def fork(index: int) -> None:
        pid = os.fork()
        if pid == 0:  # the worker: never returns into this loop
            code = 1
            try:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                _stop_with(parent)
                code = child(index)
            finally:
                logging.shutdown()
                os._exit(code)
        children[pid] = index
        started[index] = time.monotonic()

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:  # exited; the loop below reaps it
                pass

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop()

    def ended(pid: int, status: int) -> int:
        """The index of the worker that ended, to start again; 0 for none."""
        nonlocal failed
        index = children.pop(pid, 0)
        if not index:  # not a worker: a child process the app's import started
            return 0
        code = os.waitstatus_to_exitcode(status)
        if stopping:  # a SIGTERM before it set its handlers ended it with nothing in flight
            failed = failed or code not in (0, -signal.SIGTERM)
            return 0
        if code == NEVER_STARTED:
            log.error("worker %d did not start: stopping the others", index)
            failed = True
            stop()
            return 0
        how = f"exit code {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"
        soon = time.monotonic() - started[index] < STABLE_S
        doubled = soon and index in pauses  # it died soon after a restart: wait twice as long
        pauses[index] = min(2 * pauses[index], MAX_PAUSE_S) if doubled else RESTART_PAUSE_S
        log.warning(
            "worker %d (pid %d) ended (%s): starting it again in %g s",
            index,
            pid,
            how,
            pauses[index],
        )
        return index

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    for index in range(1, count + 1):
        fork(index)
    while children:
        again = [ended(*os.waitpid(-1, 0))]  # retried after a signal's handler (PEP 475)
        if not again[0]:
            continue
        resume = time.monotonic() + pauses[again[0]]
        while not stopping and time.monotonic() < resume:  # a stop does not wait for it
            time.sleep(0.05)
        while children:  # those that ended meanwhile start again with it, not a pause later
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            again.append(ended(pid, status))
        for index in again:
            if index and not stopping:
                fork(index)
    return 1 if failed else 0
