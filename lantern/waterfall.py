"""The run waterfall in the terminal: a row per step, from the journal alone.

``render`` hands each line to a function (``click.echo``, or a rich console's print), with
ANSI colours when asked for: plain aligned columns and a handful of escape codes need no
terminal library, whose import alone was a fifth of ``lantern runs show``'s start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from lantern.engine import events as ev


class Event(Protocol):
    """A journal event as the store or the API client gives it."""

    @property
    def seq(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def at(self) -> datetime: ...
    @property
    def step_id(self) -> str | None: ...
    @property
    def attempt(self) -> int | None: ...
    @property
    def data(self) -> Mapping[str, Any]: ...


class Delivery(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def step_id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def target(self) -> str | None: ...
    @property
    def status(self) -> str: ...


class Run(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def agent_name(self) -> str: ...
    @property
    def agent_version(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def error(self) -> Any: ...


BAR_WIDTH = 32
# The styles used, as ANSI SGR codes.
_SGR = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
}
_STYLE = {
    "completed": "green",
    "failed": "red",
    "in flight": "yellow",
    "retried": "magenta",
    "waiting": "blue",
    "skipped": "dim",
    "stopped": "red",
}


@dataclass(frozen=True)
class StepRow:
    step_id: str
    node_type: str
    start: float  # seconds from run_started
    duration: float | None  # None while in flight
    # completed | failed | retried (another attempt follows) | waiting | in flight | skipped
    # | stopped (open when the run ended: a cancel, or a sibling's failure)
    status: str
    attempt: int
    replayed: bool  # served from the journal by a later re-drive
    rerun: bool = False  # in flight at a crash, so executed again with the same key
    model: str = ""  # a model step's model and provider: "offline/echo (offline)"


def step_rows(events: Sequence[Event]) -> list[StepRow]:
    """One row per step attempt, in the order the attempts started."""
    if not events:
        return []
    origin = events[0].at
    # A re-run after a crash journals the same (step, attempt) again: keep the first start.
    started: dict[tuple[str, int], tuple[datetime, str]] = {}
    ended: dict[tuple[str, int], tuple[datetime, str]] = {}
    replayed: set[str] = set()
    rerun: set[str] = set()
    models: dict[str, str] = {}
    for e in events:
        if not e.step_id and e.kind != ev.RUN_RECOVERED:
            continue
        if e.kind == ev.STEP_STARTED and e.step_id:
            started.setdefault((e.step_id, e.attempt or 1), (e.at, e.data.get("type", "")))
            if "replayedFrom" in e.data:  # a retry copied it from the run it retries
                replayed.add(e.step_id)
        elif e.kind == ev.STEP_SKIPPED and e.step_id:
            started.setdefault((e.step_id, 0), (e.at, e.data.get("type", "")))
            ended[(e.step_id, 0)] = (e.at, "skipped")
        elif e.kind in (ev.STEP_COMPLETED, ev.STEP_FAILED) and e.step_id:
            status = "completed" if e.kind == ev.STEP_COMPLETED else "failed"
            ended[(e.step_id, e.attempt or 1)] = (e.at, status)
            output = e.data.get("output")
            if "usage" in e.data and isinstance(output, dict) and output.get("provider"):
                models[e.step_id] = f"{output.get('model')} ({output['provider']})"
        elif e.kind == ev.STEP_RETRYING and e.step_id:
            ended[(e.step_id, int(e.data.get("attempt", 2)) - 1)] = (e.at, "retried")
        elif e.kind == ev.STEP_WAITING and e.step_id:
            # Parked at an approval or on a sub-agent; its completion later replaces this.
            ended[(e.step_id, e.attempt or 1)] = (e.at, "waiting")
        elif e.kind == ev.RUN_RECOVERED:
            replayed.update(e.data.get("replayed", []))
            rerun.update(e.data.get("inFlight", []))
    # A step still open when the run ended (cancelled, or a sibling failed) was stopped.
    over = any(e.kind in ev.TERMINAL_KINDS for e in events)
    rows = []
    for (step, attempt), (at, node_type) in started.items():
        end = ended.get((step, attempt))
        rows.append(
            StepRow(
                step_id=step,
                node_type=node_type,
                start=(at - origin).total_seconds(),
                duration=None if end is None else (end[0] - at).total_seconds(),
                status=("stopped" if over else "in flight") if end is None else end[1],
                attempt=attempt,
                replayed=step in replayed,
                rerun=step in rerun,
                model=models.get(step, ""),
            )
        )
    return rows


@dataclass(frozen=True)
class VmLane:
    """One VM of a microVM run: where it ran, under what, and how it ended."""

    vm_id: str
    node_id: str
    driver: str
    attempt: int
    resume: bool
    start: float  # seconds from the run's first event: its vm_scheduled
    duration: float | None  # None while it lives
    ended: str  # exited | timeout | killed | node_lost | "" while it lives
    served: int  # completed steps a resumed VM was served from the journal


_VM_STYLE = {"exited": "green", "timeout": "red", "killed": "red", "node_lost": "red", "": "yellow"}


def vm_lanes(events: Sequence[Event]) -> list[VmLane]:
    """A lane per VM, in the order they were placed (their vm_* events)."""
    if not events:
        return []
    origin = events[0].at
    placed: dict[str, tuple[datetime, Mapping[str, Any], int]] = {}
    ends: dict[str, tuple[datetime, str]] = {}
    completed = 0
    for e in events:
        if e.kind == ev.STEP_COMPLETED:
            completed += 1
        vm_id = e.data.get("vmId") if e.kind.startswith("vm_") else None
        if not isinstance(vm_id, str):
            continue
        if e.kind == ev.VM_SCHEDULED:
            placed[vm_id] = (e.at, e.data, completed)
        elif e.kind in (ev.VM_EXITED, ev.VM_TERMINATED):
            ends[vm_id] = (e.at, str(e.data.get("reason", "")))
    lanes = []
    for vm_id, (at, data, done) in placed.items():
        end = ends.get(vm_id)
        resume = bool(data.get("resume"))
        lanes.append(
            VmLane(
                vm_id,
                str(data.get("nodeId", "")),
                str(data.get("driver", "")),
                int(data.get("attempt", 1)),
                resume,
                (at - origin).total_seconds(),
                None if end is None else (end[0] - at).total_seconds(),
                "" if end is None else end[1],
                done if resume else 0,
            )
        )
    return lanes


# A table cell: its text, or its text and a style of _SGR.
Cell = str | tuple[str, str]


class Painter:
    """Lines out, each through ``write``; styled with ANSI codes when ``color``."""

    def __init__(self, write: Callable[[str], object], color: bool) -> None:
        self.write = write
        self.color = color

    def paint(self, text: str, style: str) -> str:
        code = _SGR.get(style)
        return f"\x1b[{code}m{text}\x1b[0m" if self.color and code and text else text

    def line(self, *parts: Cell) -> None:
        self.write("".join(p if isinstance(p, str) else self.paint(*p) for p in parts))

    def table(self, header: Sequence[str], rows: Sequence[Sequence[Cell]]) -> None:
        """Columns two spaces apart, the header bold, the last column not padded."""
        texts = [[c if isinstance(c, str) else c[0] for c in row] for row in rows]
        widths = [max([len(h), *(len(t[i]) for t in texts)]) for i, h in enumerate(header)]
        last = len(header) - 1
        titles = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
        self.write(self.paint(titles.rstrip(), "bold"))
        for row, text in zip(rows, texts, strict=True):
            cells = []
            for i, (cell, width) in enumerate(zip(row, widths, strict=True)):
                pad = "" if i == last else " " * (width - len(text[i]))
                cells.append((cell if isinstance(cell, str) else self.paint(*cell)) + pad)
            self.write("  ".join(cells).rstrip())


def render_vms(lanes: Sequence[VmLane], total: float, out: Painter) -> None:
    rows: list[list[Cell]] = []
    for lane in lanes:
        offset = int(lane.start / total * BAR_WIDTH)
        length = max(1, int((lane.duration or 0) / total * BAR_WIDTH))
        style = _VM_STYLE.get(lane.ended, "red")
        rows.append(
            [
                f"VM {lane.attempt}",
                lane.node_id,
                lane.driver,
                f"+{lane.start * 1000:.0f}ms",
                "…" if lane.duration is None else f"{lane.duration * 1000:.0f}ms",
                (" " * offset + "█" * min(length, BAR_WIDTH - offset), style),
                (lane.ended or "running", style),
            ]
        )
    out.table(("vm", "node", "driver", "start", "duration", "", "ended"), rows)
    for lane in lanes:
        note = f"LANTERN_RESUME=1, {lane.served} step(s) served from the journal"
        out.line(f"  VM {lane.attempt}: {lane.vm_id}" + (f"; {note}" if lane.resume else ""))


def render(
    run: Run,
    events: Sequence[Event],
    write: Callable[[str], object],
    deliveries: Sequence[Delivery] = (),
    *,
    color: bool = False,
) -> None:
    """The waterfall of ``run``, a line at a time through ``write``; ANSI-coloured when
    ``color``."""
    out = Painter(write, color)
    rows = step_rows(events)
    lanes = vm_lanes(events)
    ends = [r.start + (r.duration or 0) for r in rows] + [
        v.start + (v.duration or 0) for v in lanes
    ]
    total = max([*ends, 0.001])
    recoveries = [e for e in events if e.kind == ev.RUN_RECOVERED]
    out.line(
        (run.id, "bold"),
        f"  agent {run.agent_name} v{run.agent_version}  status ",
        (run.status, "bold"),
        f"  {len(events)} events  {len(recoveries)} recover",
        "y" if len(recoveries) == 1 else "ies",
    )
    table: list[list[Cell]] = []
    for r in rows:
        offset = int(r.start / total * BAR_WIDTH)
        length = max(1, int((r.duration or 0) / total * BAR_WIDTH))
        style = _STYLE.get(r.status, "")
        table.append(
            [
                r.step_id,
                r.node_type,
                f"+{r.start * 1000:.0f}ms",
                "…" if r.duration is None else f"{r.duration * 1000:.0f}ms",
                (" " * offset + "█" * length, style),
                (r.status, style),
                str(r.attempt),
                "replayed" if r.replayed else "re-run, same key" if r.rerun else "",
            ]
        )
    out.table(("step", "type", "start", "duration", "", "status", "attempt", "journal"), table)
    if lanes:  # a microVM run: a lane per VM, which node and driver, why it ended
        render_vms(lanes, total, out)
    for r in rows:
        if r.model:  # which model answered, and who: "offline" says no provider was paid
            out.line(f"  {r.step_id}: model {r.model}")
    usage: Any = getattr(run, "usage", None)
    if usage is not None and usage.model_calls:
        out.line(
            f"  usage: {usage.model_calls} model call(s), {usage.input_tokens} input and"
            f" {usage.output_tokens} output tokens, ${usage.cost_usd:.6f}"
        )
    for e in events:
        if e.kind == ev.STEP_RESUMED and e.step_id and e.data.get("decision"):
            out.line(f"  {e.step_id}: {decided(e.data)}")
    for e in recoveries:
        out.line(
            f"  recovered at seq {e.seq}: {e.data.get('fromWorker')} -> {e.data.get('toWorker')}"
            f" (epoch {e.data.get('epoch')}); replayed {len(e.data.get('replayed', []))} step(s)"
            f" from the journal, re-ran {', '.join(e.data.get('inFlight', [])) or 'nothing'}"
        )
    if deliveries:
        marks: list[list[Cell]] = []
        for d in deliveries:
            # Claimed and never finished: the process died mid-delivery. Never hide it.
            status = "unknown (cut off by a crash)" if d.status == "claimed" else d.status
            style = {"delivered": "green", "failed": "red"}.get(d.status, "yellow")
            marks.append([d.name, d.step_id, d.kind, d.target or "", (status, style)])
        out.table(("delivery", "step", "kind", "to", "status"), marks)
    if run.error:
        out.line(("error:", "red"), f" {run.error}")
    waits_for = getattr(run, "waiting_for", None)
    if waits_for and run.status == "waiting":
        parked = [e for e in events if e.kind == "run_parked"]
        by = parked[-1].data if parked else {}
        has = by.get("workerVersion") or "no such agent"
        out.line(
            (f"waits for version {waits_for}", "yellow"),
            f" of agent {run.agent_name}: replica"
            f" {by.get('worker', '?')} has {has}, so it left the run to one that has it."
            f" Once you know other code replays it: lantern runs resume {run.id} --version NEW",
        )


def decided(data: Mapping[str, Any]) -> str:
    """An approval's decision and who made it, as the browser's waterfall words it:
    "approved by alice (key 1a2b3c4d5e6f): looks fine"."""
    approver = data.get("approver") or {}
    if approver.get("keyId"):
        key = f"key {approver['keyId']}"
        who = f"{approver['keyName']} ({key})" if approver.get("keyName") else key
    else:
        who = str(data.get("by") or "someone")
    comment = f": {data['comment']}" if data.get("comment") else ""
    return f"{data['decision']} by {who}{comment}"
