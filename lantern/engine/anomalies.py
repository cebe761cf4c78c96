"""Anomaly detection: a run that loops, sprawls, retries in a storm or spends far above normal.

Kinds (each raised at most once per run, journaled as ``anomaly_detected {kind, detail,
policy}``):

- ``runaway_loop``: the same node, or the same tool call with the same arguments, started more
  than ``repeats`` times in a run.
- ``excessive_steps``: more than ``maxSteps`` step attempts in a run.
- ``retry_storm``: more than ``maxRetries`` retries in a run, or more than ``perMinute`` retries
  in the run's workspace within a minute (counted by each replica for the runs it drives).
- ``cost_spike`` / ``token_spike``: a step whose output's ``usage`` is more than ``factor``
  times the median of the same step in the agent's recent runs, or a run whose spend so far
  is more than ``factor`` times the median of those runs' totals (with at least
  ``MIN_SAMPLES`` of them), from the journal.

Each kind has a policy: ``record`` (the default: journal it and go on), ``pause`` (park the
run at an implicit approval named ``anomaly:<kind>``) or ``fail`` (fail the run).
The agent definition sets them: ``"anomalies": {"excessive_steps": {"maxSteps": 50,
"policy": "fail"}, ...}``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter, defaultdict, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lantern.engine import events as ev
from lantern.store.records import Event, NewEvent

KINDS = ("runaway_loop", "excessive_steps", "retry_storm", "cost_spike", "token_spike")
POLICIES = ("record", "pause", "fail")
MIN_SAMPLES = 5
RUN_TOTALS = ""  # the baseline's key for whole runs' usage (no step has an empty id)
DEFAULTS: dict[str, dict[str, Any]] = {
    "runaway_loop": {"repeats": 5},
    "excessive_steps": {"maxSteps": 500},
    "retry_storm": {"maxRetries": 20, "perMinute": 120},
    "cost_spike": {"factor": 5},
    "token_spike": {"factor": 5},
}


@dataclass(frozen=True)
class Anomaly:
    kind: str
    detail: dict[str, Any]
    policy: str


def check_config(value: Any, problems: list[str]) -> None:
    """Validate an agent definition's ``anomalies`` block into ``problems``."""
    if not isinstance(value, dict):
        problems.append("anomalies must be an object keyed by kind")
        return
    for kind, conf in value.items():
        if kind not in KINDS:
            problems.append(f"anomalies: unknown kind {kind!r} (known: {', '.join(KINDS)})")
            continue
        if not isinstance(conf, dict):
            problems.append(f"anomalies.{kind} must be an object")
            continue
        for name, limit in conf.items():
            if name == "policy":
                if limit not in POLICIES:
                    problems.append(f"anomalies.{kind}.policy must be one of {', '.join(POLICIES)}")
            elif name not in DEFAULTS[kind]:
                known = ", ".join(["policy", *DEFAULTS[kind]])
                problems.append(f"anomalies.{kind}: unknown field {name!r} (known: {known})")
            elif not _positive(limit, whole=name != "factor"):
                what = "number" if name == "factor" else "integer"
                problems.append(f"anomalies.{kind}.{name} must be a positive {what}")


def _positive(value: Any, *, whole: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return False
    return isinstance(value, int) or not whole


def settings(definition: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every kind's limits and policy: the definition's over the defaults."""
    given = definition.get("anomalies") or {}
    return {kind: {"policy": "record", **DEFAULTS[kind], **given.get(kind, {})} for kind in KINDS}


class RetryRates:
    """Retries per workspace in the last minute, as this replica saw them."""

    def __init__(self) -> None:
        self._seen: dict[str, deque[float]] = defaultdict(deque)

    def add(self, workspace: str, n: int) -> int:
        now = time.monotonic()
        window = self._seen[workspace]
        window.extend([now] * n)
        while window and window[0] < now - 60:
            window.popleft()
        return len(window)


@dataclass
class Detector:
    """One drive's view: what the journal already holds, then each commit's new events."""

    workspace: str
    limits: dict[str, dict[str, Any]]
    rates: RetryRates
    # step -> recent usages of that step in the agent's runs, read when first needed
    baseline: Callable[[], Awaitable[Mapping[str, Sequence[Mapping[str, Any]]]]]
    raised: set[str] = field(default_factory=set)
    starts: Counter[str] = field(default_factory=Counter)  # signature -> times started
    steps: int = 0
    retries: int = 0
    spent: dict[str, float] = field(default_factory=lambda: {"tokens": 0.0, "cost": 0.0})

    def replay(self, events: Iterable[Event | NewEvent]) -> None:
        """Count what is journaled: events read back on a re-drive, then each commit's."""
        for e in events:
            if e.kind == ev.ANOMALY_DETECTED:
                self.raised.add(e.data.get("kind", ""))
            elif e.kind == ev.STEP_STARTED and e.step_id:
                self.steps += 1
                self.starts[signature(e.step_id, e.data)] += 1
            elif e.kind == ev.STEP_RETRYING:
                self.retries += 1
            elif e.kind == ev.STEP_COMPLETED:
                usage = _usage_of(e.data)
                if usage is not None:
                    self.spent["tokens"] += _tokens(usage)
                    self.spent["cost"] += _cost(usage)

    async def check(self, events: Sequence[NewEvent], starting: Sequence[str]) -> list[Anomaly]:
        """The anomalies raised by a commit about to be made: ``events`` (how steps ended)
        and the steps it would start. Each kind is raised once a run."""
        found: list[Anomaly] = []
        repeats = self.limits["runaway_loop"]["repeats"]
        pending = Counter(starting)
        for step, n in pending.items():
            if self.starts[step] + n > repeats:
                self._raise(found, "runaway_loop", step=step, started=self.starts[step] + n)
        most = self.limits["excessive_steps"]["maxSteps"]
        if self.steps + len(starting) > most:
            self._raise(found, "excessive_steps", steps=self.steps + len(starting), maxSteps=most)
        retries = sum(1 for e in events if e.kind == ev.STEP_RETRYING)
        storm = self.limits["retry_storm"]
        rate = self.rates.add(self.workspace, retries) if retries else 0
        if self.retries + retries > storm["maxRetries"]:
            total = self.retries + retries
            self._raise(found, "retry_storm", retries=total, maxRetries=storm["maxRetries"])
        elif rate > storm["perMinute"]:
            self._raise(
                found, "retry_storm", workspaceRetriesPerMinute=rate, perMinute=storm["perMinute"]
            )
        tokens, cost = self.spent["tokens"], self.spent["cost"]
        for e in events:
            usage = _usage_of(e.data) if e.kind == ev.STEP_COMPLETED else None
            if usage is not None and e.step_id:
                await self._spikes(found, e.step_id, usage)
                tokens, cost = tokens + _tokens(usage), cost + _cost(usage)
        if (tokens, cost) != (self.spent["tokens"], self.spent["cost"]):
            await self._run_spikes(found, tokens, cost)
        return found

    async def _run_spikes(self, found: list[Anomaly], tokens: float, cost: float) -> None:
        """The run so far against whole recent runs of the agent: a run that spends far
        above normal is caught while it spends, not after."""
        history = (await self.baseline()).get(RUN_TOTALS, ())
        if len(history) < MIN_SAMPLES:
            return
        for kind, value, measure in (("token_spike", tokens, _tokens), ("cost_spike", cost, _cost)):
            median = statistics.median(measure(u) for u in history)
            factor = self.limits[kind]["factor"]
            if median > 0 and value > factor * median:
                self._raise(found, kind, scope="run", value=value, median=median, factor=factor)

    async def _spikes(self, found: list[Anomaly], step: str, usage: Mapping[str, Any]) -> None:
        history = (await self.baseline()).get(step, ())
        if len(history) < MIN_SAMPLES:
            return
        for kind, measure in (("token_spike", _tokens), ("cost_spike", _cost)):
            value, median = measure(usage), statistics.median(measure(u) for u in history)
            factor = self.limits[kind]["factor"]
            if median > 0 and value > factor * median:
                self._raise(
                    found, kind, scope="step", step=step, value=value, median=median, factor=factor
                )

    def _raise(self, found: list[Anomaly], kind: str, **detail: Any) -> None:
        if kind not in self.raised:
            self.raised.add(kind)
            found.append(Anomaly(kind, detail, self.limits[kind]["policy"]))


def signature(step: str, data: Mapping[str, Any]) -> str:
    """A tool call is the same call when its name and arguments are; otherwise the node."""
    call = data.get("call")
    if isinstance(call, dict):
        return json.dumps(call, sort_keys=True, default=str)
    return step


def _usage_of(data: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A completed step's usage: beside its output (so also when the output is a blob), or,
    from a journal written before usage rode beside it, inside the output."""
    usage = data.get("usage")
    if not isinstance(usage, dict):
        output = data.get("output")
        usage = output.get("usage") if isinstance(output, dict) else None
    return usage if isinstance(usage, dict) else None


def _tokens(usage: Mapping[str, Any]) -> float:
    return float(usage.get("inputTokens") or 0) + float(usage.get("outputTokens") or 0)


def _cost(usage: Mapping[str, Any]) -> float:
    return float(usage.get("costUsd") or 0)
