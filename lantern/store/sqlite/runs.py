"""Agents, runs, API keys, usage, and run control (approvals, wake-ups, sub-agents)."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from lantern.errors import Conflict, LanternError, NotFound, StoreError
from lantern.store.codec import dumps, loads_or_none
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
from lantern.store.sqlite.connection import SQLiteConnection
from lantern.store.sqlite.rows import _RUN_COLUMNS, _api_key, _run, _time, violated


class Runs(SQLiteConnection):
    # -- agents -----------------------------------------------------------------------

    async def put_agent(
        self, workspace: str, name: str, definition: dict[str, Any]
    ) -> AgentVersion:
        now = time.time()

        def tx(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT COALESCE(MAX(version), 0) + 1 FROM agents WHERE workspace = ? AND name = ?",
                (workspace, name),
            ).fetchone()
            conn.execute(
                "INSERT INTO agents VALUES (?, ?, ?, ?, ?)",
                (workspace, name, row[0], dumps(definition), now),
            )
            return int(row[0])

        version = await self._write(tx)
        return AgentVersion(workspace, name, version, definition, _time(now))

    async def get_agent(
        self, workspace: str, name: str, version: int | None = None
    ) -> AgentVersion | None:
        sql = "SELECT workspace, name, version, definition, created_at FROM agents"
        sql += " WHERE workspace = ? AND name = ?"
        args: tuple[Any, ...] = (workspace, name)
        if version is not None:
            sql += " AND version = ?"
            args += (version,)
        sql += " ORDER BY version DESC LIMIT 1"
        row = await self._read(lambda c: c.execute(sql, args).fetchone())
        if row is None:
            return None
        return AgentVersion(row[0], row[1], row[2], loads_or_none(row[3]), _time(row[4]))

    async def list_agents(
        self, workspace: str, *, limit: int = 1000, after: str | None = None
    ) -> list[AgentVersion]:
        sql = (
            "SELECT a.workspace, a.name, a.version, a.definition, a.created_at FROM agents a"
            " WHERE a.workspace = ? AND a.name > ? AND a.version ="
            " (SELECT MAX(version) FROM agents b"
            " WHERE b.workspace = a.workspace AND b.name = a.name)"
            " ORDER BY a.name LIMIT ?"
        )
        args = (workspace, after or "", limit)
        rows = await self._read(lambda c: c.execute(sql, args).fetchall())
        return [AgentVersion(r[0], r[1], r[2], loads_or_none(r[3]), _time(r[4])) for r in rows]

    # -- runs -------------------------------------------------------------------------

    async def create_run(
        self,
        run: Run,
        *,
        idempotency_key: str | None = None,
        request_digest: str | None = None,
        flow: FlowOf | None = None,
    ) -> Run:
        try:
            row = await self._write(
                lambda conn: insert_run(conn, run, idempotency_key, request_digest, flow)
            )
        except sqlite3.IntegrityError as exc:
            raise refused(run, idempotency_key, exc) from exc
        return created(run, row)

    async def run_for_key(self, workspace: str, idempotency_key: str) -> tuple[Run, str] | None:
        sql = (
            f"SELECT {_RUN_COLUMNS}, request_digest FROM runs"
            " WHERE workspace = ? AND idempotency_key = ?"
        )
        row = await self._lookup(lambda c: c.execute(sql, (workspace, idempotency_key)).fetchone())
        return None if row is None else (_run(row), row[-1] or "")

    async def request_cancel(self, run_id: str) -> bool:
        sql = (
            "UPDATE runs SET cancel_requested = 1, updated_at = ?"
            " WHERE id = ? AND status NOT IN ('succeeded', 'failed', 'cancelled')"
        )
        args = (time.time(), run_id)
        return bool(await self._write(lambda c: c.execute(sql, args).rowcount))

    async def cancel_requested(self, run_ids: Sequence[str]) -> set[str]:
        if not run_ids:
            return set()
        sql = (
            f"SELECT id FROM runs WHERE cancel_requested = 1"
            f" AND id IN ({', '.join('?' * len(run_ids))})"
        )
        rows = await self._lookup(lambda c: c.execute(sql, tuple(run_ids)).fetchall())
        return {r[0] for r in rows}

    # -- API keys ---------------------------------------------------------------------

    async def create_api_key(self, key: ApiKey) -> None:
        args = (
            key.id,
            key.workspace,
            key.secret_hash,
            " ".join(sorted(key.scopes)),
            key.created_at.timestamp(),
            key.name,
        )
        sql = (
            "INSERT INTO api_keys (id, workspace, secret_hash, scopes, created_at, name)"
            " VALUES (?,?,?,?,?,?)"
        )
        await self._write(lambda c: c.execute(sql, args))

    async def get_api_key(self, key_id: str) -> ApiKey | None:
        sql = "SELECT * FROM api_keys WHERE id = ?"
        row = await self._lookup(lambda c: c.execute(sql, (key_id,)).fetchone())
        return None if row is None else _api_key(row)

    async def list_api_keys(self, workspace: str | None = None) -> list[ApiKey]:
        sql = "SELECT * FROM api_keys WHERE ? IS NULL OR workspace = ? ORDER BY created_at"
        rows = await self._read(lambda c: c.execute(sql, (workspace, workspace)).fetchall())
        return [_api_key(r) for r in rows]

    async def revoke_api_key(self, key_id: str) -> bool:
        sql = "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL"
        args = (time.time(), key_id)
        return bool(await self._write(lambda c: c.execute(sql, args).rowcount))

    async def workspace_usage(self, workspace: str, since: datetime) -> RunUsage:
        sql = (
            "SELECT COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0),"
            " COALESCE(SUM(cost_usd), 0), COALESCE(SUM(model_calls), 0)"
            " FROM runs WHERE workspace = ? AND created_at >= ?"
        )
        row = await self._read(lambda c: c.execute(sql, (workspace, since.timestamp())).fetchone())
        return RunUsage(int(row[0]), int(row[1]), float(row[2]), int(row[3]))

    async def get_run(self, run_id: str) -> Run | None:
        sql = f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?"
        row = await self._lookup(lambda c: c.execute(sql, (run_id,)).fetchone())
        return None if row is None else _run(row)

    async def get_runs(self, run_ids: Sequence[str]) -> dict[str, Run]:
        if not run_ids:
            return {}

        def read(conn: sqlite3.Connection) -> list[sqlite3.Row]:
            rows: list[sqlite3.Row] = []
            for ids in in_lists(run_ids):
                sql = f"SELECT {_RUN_COLUMNS} FROM runs WHERE id IN ({marks(ids)})"
                rows += conn.execute(sql, ids).fetchall()
            return rows

        return {run.id: run for run in map(_run, await self._lookup(read))}

    async def list_runs(
        self,
        workspace: str,
        *,
        status: RunStatus | None = None,
        agent_name: str | None = None,
        limit: int = 50,
        before: str | None = None,
    ) -> list[Run]:
        sql = f"SELECT {_RUN_COLUMNS} FROM runs WHERE workspace = ?"
        args: list[Any] = [workspace]
        for condition, value in (
            ("status = ?", status),
            ("agent_name = ?", agent_name),
            ("id < ?", before),
        ):
            if value is not None:
                sql += " AND " + condition
                args.append(value)
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(limit)
        rows = await self._read(lambda c: c.execute(sql, args).fetchall())
        return [_run(r) for r in rows]

    # -- run control: parked runs, approvals, sub-agents ------------------------------

    async def decide(self, decision: Decision) -> bool:
        d = decision

        def tx(conn: sqlite3.Connection) -> bool:
            now = time.time()
            done = conn.execute(
                "INSERT INTO approvals (run_id, node_id, decision, decided_by, comment,"
                " decided_at, decided_by_name) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (d.run_id, d.node_id, d.decision, d.decided_by, d.comment, now, d.decided_by_name),
            ).rowcount
            if done:
                conn.execute(
                    "UPDATE runs SET wake_at = ? WHERE id = ? AND status = 'waiting'",
                    (now, d.run_id),
                )
            return bool(done)

        return await self._write(tx)

    async def decisions(self, run_id: str) -> dict[str, Decision]:
        rows = await self._read(
            lambda c: c.execute(
                "SELECT run_id, node_id, decision, decided_by, comment, decided_at,"
                " decided_by_name FROM approvals WHERE run_id = ?",
                (run_id,),
            ).fetchall()
        )
        return {r[1]: Decision(r[0], r[1], r[2], r[3], r[4], _time(r[5]), r[6]) for r in rows}

    async def wake(self, run_id: str) -> None:
        sql = "UPDATE runs SET wake_at = ? WHERE id = ? AND status = 'waiting'"
        args = (time.time(), run_id)
        await self._write(lambda c: c.execute(sql, args))

    async def runs_waiting_for(self, agent_name: str, versions: Sequence[str]) -> list[str]:
        if not versions:
            return []
        marks = ",".join("?" * len(versions))
        sql = (
            f"SELECT id FROM runs WHERE agent_name = ? AND waiting_for IN ({marks})"
            " AND status = 'waiting' ORDER BY id LIMIT 100"
        )
        rows = await self._read(lambda c: c.execute(sql, (agent_name, *versions)).fetchall())
        return [r[0] for r in rows]

    async def run_detail(self, run_id: str) -> RunDetail | None:
        sql = (
            f"SELECT {_RUN_COLUMNS}, idempotency_key, (SELECT json_group_array(id) FROM"
            " (SELECT id FROM runs WHERE parent_run_id = ? ORDER BY id)) FROM runs WHERE id = ?"
        )
        row = await self._lookup(lambda c: c.execute(sql, (run_id, run_id)).fetchone())
        if row is None:
            return None
        return RunDetail(_run(row), json.loads(row[-1]), row[-2])

    async def children(self, run_id: str) -> list[Run]:
        sql = f"SELECT {_RUN_COLUMNS} FROM runs WHERE parent_run_id = ? ORDER BY id"
        rows = await self._lookup(lambda c: c.execute(sql, (run_id,)).fetchall())
        return [_run(r) for r in rows]

    async def recent_step_usage(
        self, workspace: str, agent_name: str, runs: int = 50
    ) -> list[tuple[str, str, dict[str, Any]]]:
        sql = (
            "SELECT e.run_id, e.step_id, json_extract(e.data, '$.output.usage')"
            " FROM journal_events e"
            " WHERE e.run_id IN (SELECT id FROM runs WHERE workspace = ? AND agent_name = ?"
            "  AND status = 'succeeded' ORDER BY id DESC LIMIT ?)"
            " AND e.kind = 'step_completed'"
            " AND json_type(e.data, '$.output.usage') = 'object'"
        )
        rows = await self._read(lambda c: c.execute(sql, (workspace, agent_name, runs)).fetchall())
        return [(r[0], r[1], loads_or_none(r[2])) for r in rows]


# The newest version, read in the transaction that inserts the run pinned to it.
_NEWEST = (
    "SELECT version, definition -> '$.concurrency', definition -> '$.maxConcurrentRuns'"
    " FROM agents WHERE workspace = ? AND name = ? ORDER BY version DESC LIMIT 1"
)
_INSERT_RUN = (
    "INSERT INTO runs (id, workspace, agent_name, agent_version, status, input,"
    " created_at, updated_at, idempotency_key, request_digest, parent_run_id, priority,"
    " flow_key, flow_limit, flow_max) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


# Ids to one IN list: far under the parameter limit of any SQLite build (999 before 3.32),
# and a receipt batch (MAX_BATCH) fits in one.
IN_LIST = 512


def in_lists(ids: Sequence[str]) -> list[tuple[str, ...]]:
    """``ids`` in IN lists of at most IN_LIST, each padded (with its last id, which changes no
    answer) to a power of two from 8: a handful of statement texts, not one per batch size,
    so they stay in the connection's statement cache and do not push the lookups out of it."""
    lists = []
    for i in range(0, len(ids), IN_LIST):
        chunk = tuple(ids[i : i + IN_LIST])
        size = max(8, 1 << (len(chunk) - 1).bit_length())
        lists.append(chunk + chunk[-1:] * (size - len(chunk)))
    return lists


def marks(ids: Sequence[str]) -> str:
    return ", ".join("?" * len(ids))


def insert_run(
    conn: sqlite3.Connection,
    run: Run,
    idempotency_key: str | None,
    request_digest: str | None,
    flow: FlowOf | None,
) -> tuple[int, RunFlow | None] | None:
    """Insert ``run`` pinned to its agent's newest version (in the caller's transaction): that
    version and what the run is claimed under, or None for an unknown agent."""
    agent = conn.execute(_NEWEST, (run.workspace, run.agent_name)).fetchone()
    if agent is None:
        return None
    version, concurrency, max_runs = agent
    settled = None
    if flow is not None and (concurrency is not None or max_runs is not None):
        settled = flow(loads_or_none(concurrency), loads_or_none(max_runs))
    created = run.created_at.timestamp()
    conn.execute(
        _INSERT_RUN,
        (
            run.id,
            run.workspace,
            run.agent_name,
            version,
            run.status,
            dumps(run.input),
            created,
            created,
            idempotency_key,
            request_digest,
            run.parent_id,
            run.priority,
            None if settled is None else settled.key,
            None if settled is None else settled.limit,
            None if settled is None else settled.max_runs,
        ),
    )
    return version, settled


def created(run: Run, row: tuple[int, RunFlow | None] | None) -> Run:
    """The run ``insert_run`` stored; NotFound when its agent is unknown."""
    if row is None:
        raise NotFound(f"agent {run.agent_name!r} not found (apply it first)")
    return replace(run, agent_version=row[0], flow=row[1])


def refused(run: Run, idempotency_key: str | None, exc: sqlite3.IntegrityError) -> LanternError:
    """The domain error for an insert of ``run`` the database refused."""
    if violated(exc) == "runs_by_idempotency_key":
        return Conflict(f"idempotency key {idempotency_key!r} was already used")
    return StoreError(f"run {run.id}: {exc}")
