"""Log lines a person (or a collector) can use: one per run start, finish, recovery and failure,
and a tool's traceback when it raises.

Each run line carries the run id, the agent, the worker and, where there is one, the step, as
``key=value`` words in the text format and as fields in the JSON one (``--log-format json``:
one object per line, for collectors). A tool's traceback goes to the server log only; the API
and the journal keep the one-line error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Literal

LogFormat = Literal["text", "json"]
FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# The record attributes a run line sets, and their names in a JSON line.
_FIELDS = {
    "run_id": "runId",
    "agent": "agent",
    "worker": "worker",
    "step": "step",
    "event": "event",
    "status": "status",
    "error": "error",
}

runs = logging.getLogger("lantern.runs")
tools = logging.getLogger("lantern.tools")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the run fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for attr, name in _FIELDS.items():
            value = getattr(record, attr, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def configure(fmt: LogFormat) -> None:
    """The process's root handler, in the chosen format (uvicorn's loggers propagate to it)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def run_events(run_id: str, agent: str, version: int, worker: str, events: Iterable[Any]) -> None:
    """The run lines for these committed events (a no-op for the step events in between)."""
    for e in events:
        kind = e.kind
        if kind not in _RUN_KINDS:
            continue
        data = e.data or {}
        fields: dict[str, Any] = {
            "run_id": run_id,
            "agent": f"{agent} v{version}",
            "worker": worker,
            "event": kind,
        }
        level = logging.INFO
        status = _STATUS.get(kind)
        if kind == "run_failed":
            error = data.get("error") or {}
            fields["step"] = error.get("step")
            fields["error"] = error.get("code")
            level = logging.WARNING
            detail = f": {error.get('message', '')}".rstrip(": ")
        elif kind == "run_recovered":
            fields["step"] = ",".join(data.get("inFlight") or []) or None
            detail = f" from {data.get('fromWorker')} (recovery {data.get('attempt')})"
        elif kind == "run_started" and data.get("retryOf"):
            # Stored by the replica that was asked, due at once for whichever claims it.
            status = "waiting"
            detail = f" retrying {data['retryOf']} from {data.get('fromStep') or 'its failure'}"
        else:
            detail = ""
        fields["status"] = status
        words = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None and k != "event")
        runs.log(level, "%s %s%s", kind.replace("_", " "), words, detail, extra=fields)


def tool_raised(name: str, run_id: str, step: str, exc: BaseException) -> None:
    """A tool's traceback, in the server log only (the step's error is one line)."""
    tools.warning(
        "tool %s raised in run %s step %s",
        name,
        run_id,
        step,
        exc_info=(type(exc), exc, exc.__traceback__),
        extra={"run_id": run_id, "step": step},
    )


_RUN_KINDS = frozenset(
    {"run_started", "run_recovered", "run_succeeded", "run_failed", "run_cancelled"}
)
_STATUS = {
    "run_started": "running",
    "run_recovered": "running",
    "run_succeeded": "succeeded",
    "run_failed": "failed",
    "run_cancelled": "cancelled",
}
