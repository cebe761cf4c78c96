"""Column lists and row mappers: SQLite keeps times as epoch seconds and JSON as text."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

from lantern.store.codec import loads_or_none
from lantern.store.records import ApiKey, Delivery, Event, Run, RunFlow, RunUsage

_RUN_COLUMNS = (
    "id, workspace, agent_name, agent_version, status, input, output, error, created_at,"
    " updated_at, cancel_requested, parent_run_id, input_tokens, output_tokens, cost_usd,"
    " model_calls, waiting_for, priority, flow_key, flow_limit, flow_max"
)
_EVENT_COLUMNS = "run_id, seq, kind, at, data, step_id, node_id, attempt, blob_digest, hash"


def _time(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def _run(row: sqlite3.Row) -> Run:
    return Run(
        id=row[0],
        workspace=row[1],
        agent_name=row[2],
        agent_version=row[3],
        status=row[4],
        input=loads_or_none(row[5]),
        output=loads_or_none(row[6]),
        error=loads_or_none(row[7]),
        created_at=_time(row[8]),
        updated_at=_time(row[9]),
        cancel_requested=bool(row[10]),
        parent_id=row[11],
        usage=RunUsage(row[12], row[13], row[14], row[15]),
        waiting_for=row[16],
        priority=row[17],
        flow=None if row[18] is None else RunFlow(row[18], row[19], row[20]),
    )


_RECEIPT_COLUMNS = (
    "run_id, step_id, delivery, attempt, idempotency_key, kind, target, status, response,"
    " claimed_at, completed_at"
)


def _delivery(row: sqlite3.Row) -> Delivery:
    run_id, step_id, name, attempt, key, kind, target, status = row[:8]
    return Delivery(
        run_id,
        step_id,
        name,
        attempt,
        key,
        kind,
        target,
        status,
        response=loads_or_none(row[8]),
        claimed_at=_time(row[9]),
        completed_at=None if row[10] is None else _time(row[10]),
    )


def _api_key(row: sqlite3.Row) -> ApiKey:
    return ApiKey(
        id=row[0],
        workspace=row[1],
        secret_hash=row[2],
        scopes=frozenset(row[3].split()),
        created_at=_time(row[4]),
        revoked_at=None if row[5] is None else _time(row[5]),
        name=row[6],
    )


def _event(row: sqlite3.Row, blob: bytes | None = None) -> Event:
    return Event(
        run_id=row[0],
        seq=row[1],
        kind=row[2],
        at=_time(row[3]),
        data=loads_or_none(row[4]),
        step_id=row[5],
        node_id=row[6],
        attempt=row[7],
        blob_digest=row[8],
        hash=row[9],
        blob=blob,
    )


# SQLite names the columns of a violated UNIQUE index, not the index: each index of the
# schema by its columns, so a conflict is matched on the constraint's name on both backends.
_UNIQUE_INDEXES = {"runs.workspace, runs.idempotency_key": "runs_by_idempotency_key"}


def violated(exc: sqlite3.IntegrityError) -> str | None:
    """The name of the UNIQUE index ``exc`` violated, when it is one of the schema's."""
    message = str(exc)
    prefix = "UNIQUE constraint failed: "
    if getattr(
        exc, "sqlite_errorname", ""
    ) != "SQLITE_CONSTRAINT_UNIQUE" and not message.startswith(prefix):
        return None
    return _UNIQUE_INDEXES.get(message.removeprefix(prefix))
