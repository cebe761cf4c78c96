"""Queue many runs at once, straight into a store's database (one INSERT ... SELECT), for tests
and benchmarks of the claim at scale: 100,000 creates through the API would take minutes and
measure the create, not the claim. The rows are what a create writes for a queued run (the
agent's version must exist); with ``keys``, run i is under flow control with concurrency key
``k{i % keys}``, limit ``limit`` and maxConcurrentRuns ``most``."""

from __future__ import annotations

import sqlite3
import time

import psycopg


def fill(
    database_url: str,
    workspace: str,
    agent: str,
    n: int,
    *,
    version: int = 1,
    keys: int | None = None,
    limit: int | None = 1,
    most: int | None = None,
    prefix: str = "bulk",
) -> None:
    flow = keys is not None
    args = {
        "n": n,
        "ws": workspace,
        "agent": agent,
        "version": version,
        "keys": keys or 1,
        "flow": flow,
        "limit": limit if flow else None,
        "most": most if flow else None,
        "prefix": f"{prefix}-{workspace}-",
        "start": time.time() - n * 1e-3,  # older than anything created after, in order
    }
    if database_url.startswith("sqlite"):
        conn = sqlite3.connect(database_url.removeprefix("sqlite:///"))
        with conn:
            conn.execute(
                "WITH RECURSIVE i(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM i WHERE x + 1 < :n)"
                " INSERT INTO runs (id, workspace, agent_name, agent_version, status, input,"
                " created_at, updated_at, flow_key, flow_limit, flow_max)"
                " SELECT :prefix || printf('%09d', x), :ws, :agent, :version, 'queued',"
                " '{}', :start + x * 1e-3, :start + x * 1e-3,"
                " CASE WHEN :flow THEN 'k' || (x % :keys) END, :limit, :most FROM i",
                args,
            )
        conn.close()
        return
    with psycopg.connect(database_url, autocommit=True) as pg:
        pg.execute(
            "INSERT INTO runs (id, workspace, agent_name, agent_version, status, input,"
            " created_at, updated_at, flow_key, flow_limit, flow_max)"
            " SELECT %(prefix)s || lpad(x::text, 9, '0'), %(ws)s, %(agent)s, %(version)s,"
            " 'queued', '{}', to_timestamp(%(start)s + x * 1e-3),"
            " to_timestamp(%(start)s + x * 1e-3),"
            " CASE WHEN %(flow)s THEN 'k' || (x %% %(keys)s) END, %(limit)s, %(most)s"
            " FROM generate_series(0, %(n)s - 1) AS x",
            args,
        )
        pg.execute("ANALYZE runs")
