"""Column lists and row mappers: psycopg already hands back datetimes and parsed JSON."""

from __future__ import annotations

from dataclasses import replace

from psycopg.rows import TupleRow

from lantern.store.records import ApiKey, Event, Run, RunFlow, RunUsage

_RUN_COLUMNS = (
    "id, workspace, agent_name, agent_version, status, input, output, error, created_at,"
    " updated_at, cancel_requested, parent_run_id, input_tokens, output_tokens, cost_usd,"
    " model_calls, waiting_for, priority, flow_key, flow_limit, flow_max"
)
_KEY_COLUMNS = "id, workspace, secret_hash, scopes, created_at, revoked_at, name"
_EVENT_COLUMNS = "run_id, seq, kind, at, data, step_id, node_id, attempt, blob_digest, hash"

_RECEIPT_COLUMNS = (
    "run_id, step_id, delivery, attempt, idempotency_key, kind, target, status, response,"
    " claimed_at, completed_at"
)


def _run(row: TupleRow) -> Run:
    run = Run(*row[:12])
    usage = RunUsage(row[12], row[13], float(row[14]), row[15])
    flow = None if row[18] is None else RunFlow(row[18], row[19], row[20])
    return replace(run, usage=usage, waiting_for=row[16], priority=row[17], flow=flow)


def _api_key(row: TupleRow) -> ApiKey:
    return ApiKey(row[0], row[1], row[2], frozenset(row[3].split()), row[4], row[5], row[6])


def _event(row: TupleRow, blob: bytes | None = None) -> Event:
    run_id, seq, kind, at, data, step_id, node_id, attempt, blob_digest, hash_ = row[:10]
    return Event(run_id, seq, kind, at, data, step_id, node_id, attempt, blob_digest, blob, hash_)
