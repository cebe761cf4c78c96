"""Which queued and woken runs a claim takes: flow control decided in one place, for both
backends (docs/flow-control.md).

Each backend's claim reads, under a lock that orders claims across replicas, a bounded set of
candidates through its indexes: the head of each workspace's queue of runs without flow
control, the head of each flow group's queue (as many as the group's free slots), the due
parked runs, how many runs hold a slot of each flow group, and when each workspace was last
served. ``pick`` then chooses, and the backend leases what it chose in the same transaction.

The rules, in order:

- a run under flow control starts only while its group (agent and concurrency key) holds fewer
  than ``limit`` slots and its agent fewer than ``maxConcurrentRuns``; a run holds a slot
  from its claim until it parks or finishes (its lease is unreleased);
- due parked runs resume first (they started before anything queued), within those limits;
- queued runs are taken round-robin across workspaces, the workspace served least recently
  first; within a workspace, higher priority first, then the oldest.

A run started on its own rather than by a replica's claim (``Store.claim_run``: a run the CLI
executes in its own process, a parked code-first run adopted by a replica that has its version)
is decided by ``admits``, under the same lock and with the same counts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Group = tuple[str, str, str]  # (workspace, agent, concurrency key)


@dataclass(frozen=True)
class Candidate:
    id: str
    workspace: str
    agent_name: str
    priority: int
    created_at: Any  # sortable: the backend's timestamp
    flow_key: str | None  # None: no flow control
    flow_limit: int | None
    flow_max: int | None
    woken: bool = False  # a due parked run, not a queued one

    @property
    def group(self) -> Group:
        return (self.workspace, self.agent_name, self.flow_key or "")


class Slots:
    """Slots held per flow group and per agent, taken as runs are picked."""

    def __init__(self, held: Iterable[tuple[Group, int]]) -> None:
        self.groups: dict[Group, int] = defaultdict(int)
        self.agents: dict[tuple[str, str], int] = defaultdict(int)
        for group, n in held:
            self.groups[group] += n
            self.agents[group[:2]] += n

    def free(self, group: Group, flow_limit: int | None, flow_max: int | None) -> int:
        """How many more runs of ``group`` may start now (a large number when unbounded)."""
        left = 1_000_000
        if flow_limit is not None:
            left = min(left, flow_limit - self.groups[group])
        if flow_max is not None:
            left = min(left, flow_max - self.agents[group[:2]])
        return left

    def take(self, c: Candidate) -> bool:
        if c.flow_key is None:
            return True
        agent = (c.workspace, c.agent_name)
        if c.flow_limit is not None and self.groups[c.group] >= c.flow_limit:
            return False
        if c.flow_max is not None and self.agents[agent] >= c.flow_max:
            return False
        self.groups[c.group] += 1
        self.agents[agent] += 1
        return True


@dataclass(frozen=True)
class Entry:
    """A shown run of a flow group in a workspace's walk (runs_flow_heads, in start order)."""

    id: str
    group: Group
    leased: bool  # claimed already, by a claim that did not pass it or by a cancel
    flow_limit: int | None
    flow_max: int | None


class Walk:
    """One workspace's walk through its shown flow runs, in start order, until ``want`` groups
    with a free slot are found. A group is seen through its first shown run not leased yet (a
    run a claim took stays shown until it opens, and is stepped over); the walk passes (hides)
    a group's later shown runs. A run is passed once, so a claim reads about as many runs as it
    takes, plus one per group at its limit: not one per key with queued runs."""

    def __init__(self, slots: Slots, want: int) -> None:
        self.slots = slots
        self.want = want
        self.open: list[tuple[Group, int]] = []  # groups with free slots, and how many
        self.hide: list[str] = []
        self._seen: set[Group] = set()

    @property
    def done(self) -> bool:
        return len(self.open) >= self.want

    def feed(self, entries: Iterable[Entry]) -> None:
        for e in entries:
            if self.done:
                return
            if e.leased:
                continue
            if e.group in self._seen:
                self.hide.append(e.id)
                continue
            self._seen.add(e.group)
            free = self.slots.free(e.group, e.flow_limit, e.flow_max)
            if free > 0:
                self.open.append((e.group, min(free, self.want)))


def marks(walks: Iterable[Walk], chosen: Iterable[Candidate]) -> tuple[list[str], list[Group]]:
    """After a claim chose: the runs its walks passed, to hide, and the groups it took a queued
    run from, whose next queued run to show (the taken one is stepped over until it opens)."""
    hide = [i for w in walks for i in w.hide]
    show = {c.group: None for c in chosen if c.flow_key is not None and not c.woken}
    return hide, list(show)


def pick(
    queued: Iterable[Candidate],
    woken: Iterable[Candidate],
    held: Iterable[tuple[Group, int]],
    served: Mapping[str, Any],
    limit: int,
) -> list[Candidate]:
    """The runs to take, at most ``limit``: ``queued`` and ``woken`` are the candidates (any
    order), ``held`` the slots each flow group holds now, ``served`` when each workspace was
    last served (absent: never, so first)."""
    slots = Slots(held)
    chosen: list[Candidate] = []
    for c in woken:
        if len(chosen) < limit and slots.take(c):
            chosen.append(c)
    queues: dict[str, list[Candidate]] = defaultdict(list)
    for c in queued:
        queues[c.workspace].append(c)
    for q in queues.values():
        q.sort(key=lambda c: (-c.priority, c.created_at, c.id), reverse=True)  # pop() = next
    order = sorted(queues, key=lambda w: (w in served, served.get(w) or 0, w))
    while len(chosen) < limit and order:
        for workspace in list(order):
            q = queues[workspace]
            while q and not slots.take(q[-1]):
                q.pop()  # its group is full: later runs of this workspace may still start
            if not q:
                order.remove(workspace)
                continue
            chosen.append(q.pop())
            if len(chosen) >= limit:
                break
    return chosen


def own_candidate(row: Sequence[Any] | None) -> Candidate | None:
    """The run a start of its own asks for, from the backend's one-run read (its candidate
    columns, then its status): None unless it is queued or parked."""
    if row is None or row[-1] not in ("queued", "waiting"):
        return None
    found, ws, agent, priority, at, key, limit, most, status = row
    return Candidate(found, ws, agent, priority, at, key, limit, most, status != "queued")


def own_counts_args(run: Candidate) -> dict[str, Any]:
    """The arguments of the backend's counts for ``admits``: the slots ``run``'s group and
    agent hold, and its group's runs queued ahead of it (read only as far as its limits)."""
    return {
        "run": run.id,
        "ws": run.workspace,
        "agent": run.agent_name,
        "key": run.flow_key,
        "queued": not run.woken,
        "priority": run.priority,
        "at": run.created_at,
        "reach": max(run.flow_limit or 0, run.flow_max or 0),
    }


def admits(run: Candidate, ahead: int, group_held: int, agent_held: int) -> bool:
    """Whether a claim would start ``run`` now on its own, ``group_held`` and ``agent_held``
    the slots its flow group and its agent hold (its own lease left out): within both limits
    once the ``ahead`` runs of its group queued before it have taken theirs (none for a
    parked run, which started before anything queued)."""
    if run.flow_key is None:
        return True
    if run.flow_limit is not None and group_held + ahead >= run.flow_limit:
        return False
    return run.flow_max is None or agent_held + ahead < run.flow_max
