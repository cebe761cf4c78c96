"""Agents, runs, API keys, usage, and run control (approvals, wake-ups, sub-agents)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb

from lantern.errors import Conflict, LanternError, NotFound, StoreError
from lantern.store.postgres.connection import PostgresConnection
from lantern.store.postgres.rows import _KEY_COLUMNS, _RUN_COLUMNS, _api_key, _run
from lantern.store.records import (
    AgentVersion,
    ApiKey,
    Decision,
    FlowOf,
    Run,
    RunDetail,
    RunFlow,
    RunStatus,
    RunUsage,
)

# Pins the agent's newest version in the same statement (one round trip per create). A
# version with flow control is not inserted but returned with its settings: the caller renders
# the run's concurrency key and inserts again pinning that version (``%(version)s``).
_CREATE_RUN = """
WITH agent AS (
    SELECT workspace, name, version, definition -> 'concurrency' AS concurrency,
           definition -> 'maxConcurrentRuns' AS max_runs
    FROM agents WHERE workspace = %(workspace)s AND name = %(agent)s
      AND (%(version)s::int IS NULL OR version = %(version)s::int)
    ORDER BY version DESC LIMIT 1
), created AS (
    INSERT INTO runs (id, workspace, agent_name, agent_version, status, input, created_at,
                      updated_at, idempotency_key, request_digest, parent_run_id, priority,
                      flow_key, flow_limit, flow_max)
    SELECT %(id)s, workspace, name, version, %(status)s, %(input)s, %(created)s, %(created)s,
           %(key)s, %(digest)s, %(parent)s, %(priority)s, %(flow_key)s, %(flow_limit)s,
           %(flow_max)s
    FROM agent
    WHERE %(version)s::int IS NOT NULL OR NOT %(flow)s
       OR (concurrency IS NULL AND max_runs IS NULL)
    RETURNING agent_version
)
SELECT a.version, a.concurrency, a.max_runs, EXISTS (SELECT 1 FROM created) FROM agent a
"""


def create_args(
    run: Run, idempotency_key: str | None, request_digest: str | None, flow: FlowOf | None
) -> dict[str, Any]:
    """``_CREATE_RUN``'s first arguments: the newest version, inserted unless ``flow`` is
    given and that version has flow control (then ``flow_args`` makes the second's)."""
    return {
        "id": run.id,
        "workspace": run.workspace,
        "agent": run.agent_name,
        "status": run.status,
        "input": Jsonb(run.input),
        "created": run.created_at,
        "key": idempotency_key,
        "digest": request_digest,
        "parent": run.parent_id,
        "priority": run.priority,
        "version": None,
        "flow": flow is not None,
        "flow_key": None,
        "flow_limit": None,
        "flow_max": None,
    }


def flow_args(
    args: dict[str, Any], flow: FlowOf | None, row: TupleRow
) -> tuple[RunFlow | None, dict[str, Any]]:
    """What the run is claimed under, and the arguments inserting it pinned to ``row``'s
    version (a first ``_CREATE_RUN`` that found flow control and inserted nothing)."""
    assert flow is not None
    settled = flow(row[1], row[2])
    if settled is not None:
        args = {
            **args,
            "flow_key": settled.key,
            "flow_limit": settled.limit,
            "flow_max": settled.max_runs,
        }
    return settled, {**args, "version": row[0]}


def created_row(run: Run, row: TupleRow | None) -> TupleRow:
    if row is None:
        raise NotFound(f"agent {run.agent_name!r} not found (apply it first)")
    return row


def refused(
    run: Run, idempotency_key: str | None, exc: psycopg.errors.UniqueViolation
) -> LanternError:
    """The domain error for an insert of ``run`` the database refused."""
    if exc.diag.constraint_name == "runs_by_idempotency_key":
        return Conflict(f"idempotency key {idempotency_key!r} was already used")
    return StoreError(f"run {run.id}: {exc}")


class Runs(PostgresConnection):
    # -- agents -----------------------------------------------------------------------

    async def put_agent(
        self, workspace: str, name: str, definition: dict[str, Any]
    ) -> AgentVersion:
        async with self._connection() as conn, conn.transaction():
            # Serialise versions of one agent; a unique violation would also catch a race.
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"agent:{workspace}/{name}",)
            )
            cur = await conn.execute(
                "INSERT INTO agents (workspace, name, version, definition)"
                " SELECT %s, %s, COALESCE(MAX(version), 0) + 1, %s FROM agents"
                " WHERE workspace = %s AND name = %s RETURNING version, created_at",
                (workspace, name, Jsonb(definition), workspace, name),
            )
            row = await cur.fetchone()
        assert row is not None
        return AgentVersion(workspace, name, row[0], definition, row[1])

    async def get_agent(
        self, workspace: str, name: str, version: int | None = None
    ) -> AgentVersion | None:
        sql = (
            "SELECT workspace, name, version, definition, created_at FROM agents"
            " WHERE workspace = %s AND name = %s"
        )
        args: tuple[Any, ...] = (workspace, name)
        if version is not None:
            sql += " AND version = %s"
            args += (version,)
        row = await self._fetchone(sql + " ORDER BY version DESC LIMIT 1", args)
        return None if row is None else AgentVersion(*row)

    async def list_agents(
        self, workspace: str, *, limit: int = 1000, after: str | None = None
    ) -> list[AgentVersion]:
        rows = await self._fetchall(
            "SELECT DISTINCT ON (name) workspace, name, version, definition, created_at"
            " FROM agents WHERE workspace = %s AND name > %s ORDER BY name, version DESC"
            " LIMIT %s",
            (workspace, after or "", limit),
        )
        return [AgentVersion(*r) for r in rows]

    # -- runs -------------------------------------------------------------------------

    async def create_run(
        self,
        run: Run,
        *,
        idempotency_key: str | None = None,
        request_digest: str | None = None,
        flow: FlowOf | None = None,
    ) -> Run:
        args = create_args(run, idempotency_key, request_digest, flow)
        row = await self._create(run, args, idempotency_key)
        settled: RunFlow | None = None
        if not row[3]:
            settled, args = flow_args(args, flow, row)
            row = await self._create(run, args, idempotency_key)
        return replace(run, agent_version=row[0], flow=settled)

    async def _create(
        self, run: Run, args: dict[str, Any], idempotency_key: str | None
    ) -> TupleRow:
        try:
            row = await self._fetchone(_CREATE_RUN, args)
        except psycopg.errors.UniqueViolation as exc:
            raise refused(run, idempotency_key, exc) from exc
        return created_row(run, row)

    async def run_for_key(self, workspace: str, idempotency_key: str) -> tuple[Run, str] | None:
        row = await self._fetchone(
            f"SELECT {_RUN_COLUMNS}, request_digest FROM runs"
            " WHERE workspace = %s AND idempotency_key = %s",
            (workspace, idempotency_key),
        )
        return None if row is None else (_run(row), row[-1] or "")

    async def request_cancel(self, run_id: str) -> bool:
        row = await self._fetchone(
            "UPDATE runs SET cancel_requested = true, updated_at = now()"
            " WHERE id = %s AND status NOT IN ('succeeded', 'failed', 'cancelled') RETURNING 1",
            (run_id,),
        )
        return row is not None

    async def cancel_requested(self, run_ids: Sequence[str]) -> set[str]:
        if not run_ids:
            return set()
        rows = await self._fetchall(
            "SELECT id FROM runs WHERE id = ANY(%s) AND cancel_requested", (list(run_ids),)
        )
        return {r[0] for r in rows}

    # -- API keys ---------------------------------------------------------------------

    async def create_api_key(self, key: ApiKey) -> None:
        async with self._connection() as conn:
            await conn.execute(
                "INSERT INTO api_keys (id, workspace, secret_hash, scopes, created_at, name)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                (
                    key.id,
                    key.workspace,
                    key.secret_hash,
                    " ".join(sorted(key.scopes)),
                    key.created_at,
                    key.name,
                ),
            )

    async def get_api_key(self, key_id: str) -> ApiKey | None:
        row = await self._fetchone(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = %s", (key_id,))
        return None if row is None else _api_key(row)

    async def list_api_keys(self, workspace: str | None = None) -> list[ApiKey]:
        rows = await self._fetchall(
            f"SELECT {_KEY_COLUMNS} FROM api_keys"
            " WHERE %s::text IS NULL OR workspace = %s ORDER BY created_at",
            (workspace, workspace),
        )
        return [_api_key(r) for r in rows]

    async def revoke_api_key(self, key_id: str) -> bool:
        row = await self._fetchone(
            "UPDATE api_keys SET revoked_at = now() WHERE id = %s AND revoked_at IS NULL"
            " RETURNING 1",
            (key_id,),
        )
        return row is not None

    async def workspace_usage(self, workspace: str, since: datetime) -> RunUsage:
        row = await self._fetchone(
            "SELECT COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0),"
            " COALESCE(SUM(cost_usd), 0), COALESCE(SUM(model_calls), 0)"
            " FROM runs WHERE workspace = %s AND created_at >= %s",
            (workspace, since),
        )
        assert row is not None
        return RunUsage(int(row[0]), int(row[1]), float(row[2]), int(row[3]))

    async def get_run(self, run_id: str) -> Run | None:
        row = await self._fetchone(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = %s", (run_id,))
        return None if row is None else _run(row)

    async def get_runs(self, run_ids: Sequence[str]) -> dict[str, Run]:
        if not run_ids:
            return {}
        # One array parameter, however many ids: no IN list to bound here.
        rows = await self._fetchall(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ANY(%s)", (list(run_ids),)
        )
        return {run.id: run for run in map(_run, rows)}

    async def list_runs(
        self,
        workspace: str,
        *,
        status: RunStatus | None = None,
        agent_name: str | None = None,
        limit: int = 50,
        before: str | None = None,
    ) -> list[Run]:
        sql = f"SELECT {_RUN_COLUMNS} FROM runs WHERE workspace = %s"
        args: list[Any] = [workspace]
        for condition, value in (
            ("status = %s", status),
            ("agent_name = %s", agent_name),
            ("id < %s", before),
        ):
            if value is not None:
                sql += " AND " + condition
                args.append(value)
        rows = await self._fetchall(sql + " ORDER BY id DESC LIMIT %s", (*args, limit))
        return [_run(r) for r in rows]

    # -- run control: parked runs, approvals, sub-agents ------------------------------

    async def decide(self, decision: Decision) -> bool:
        d = decision
        async with self._connection() as conn, conn.transaction():
            # The run's row first: a run that is parking (its step_waiting committed, its
            # status not yet) commits that before this goes on, so it is seen waiting and
            # woken below; or the park waits for this decision to commit, and then finds it
            # when it looks once more. Without the lock, a decision that committed just after
            # the park had looked was never acted on: the run waited for ever.
            await conn.execute("SELECT 1 FROM runs WHERE id = %s FOR UPDATE", (d.run_id,))
            cur = await conn.execute(
                "INSERT INTO approvals"
                " (run_id, node_id, decision, decided_by, comment, decided_by_name)"
                " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (d.run_id, d.node_id, d.decision, d.decided_by, d.comment, d.decided_by_name),
            )
            if not cur.rowcount:
                return False
            await conn.execute(
                "UPDATE runs SET wake_at = now() WHERE id = %s AND status = 'waiting'",
                (d.run_id,),
            )
        return True

    async def decisions(self, run_id: str) -> dict[str, Decision]:
        rows = await self._fetchall(
            "SELECT run_id, node_id, decision, decided_by, comment, decided_at, decided_by_name"
            " FROM approvals WHERE run_id = %s",
            (run_id,),
        )
        return {r[1]: Decision(*r) for r in rows}

    async def wake(self, run_id: str) -> None:
        async with self._connection() as conn:
            await conn.execute(
                "UPDATE runs SET wake_at = now() WHERE id = %s AND status = 'waiting'", (run_id,)
            )

    async def runs_waiting_for(self, agent_name: str, versions: Sequence[str]) -> list[str]:
        rows = await self._fetchall(
            "SELECT id FROM runs WHERE agent_name = %s AND waiting_for = ANY(%s)"
            " AND status = 'waiting' ORDER BY id LIMIT 100",
            (agent_name, list(versions)),
        )
        return [r[0] for r in rows]

    async def run_detail(self, run_id: str) -> RunDetail | None:
        row = await self._fetchone(
            f"SELECT {_RUN_COLUMNS}, idempotency_key, ARRAY(SELECT c.id FROM runs c"
            " WHERE c.parent_run_id = %s ORDER BY c.id) FROM runs WHERE id = %s",
            (run_id, run_id),
        )
        return None if row is None else RunDetail(_run(row), list(row[-1]), row[-2])

    async def children(self, run_id: str) -> list[Run]:
        rows = await self._fetchall(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE parent_run_id = %s ORDER BY id", (run_id,)
        )
        return [_run(r) for r in rows]

    async def recent_step_usage(
        self, workspace: str, agent_name: str, runs: int = 50
    ) -> list[tuple[str, str, dict[str, Any]]]:
        rows = await self._fetchall(
            "SELECT e.run_id, e.step_id, e.data->'output'->'usage' FROM journal_events e"
            " WHERE e.run_id IN (SELECT id FROM runs WHERE workspace = %s AND agent_name = %s"
            "  AND status = 'succeeded' ORDER BY id DESC LIMIT %s)"
            " AND e.kind = 'step_completed'"
            " AND jsonb_typeof(e.data->'output'->'usage') = 'object'",
            (workspace, agent_name, runs),
        )
        return [(r[0], r[1], r[2]) for r in rows]
