"""A database built by the numbered migrations equals one built from schema.sql."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg

from lantern.store import open_store
from lantern.store.migrations import migrations, schema


def sqlite_shape(path: Path) -> dict[str, Any]:
    conn = sqlite3.connect(path)
    shape: dict[str, Any] = {}
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            " AND name != 'schema_migrations'"
        )
    ]
    for t in tables:
        shape[t] = {
            "columns": conn.execute(f"PRAGMA table_info({t})").fetchall(),
            "foreign_keys": conn.execute(f"PRAGMA foreign_key_list({t})").fetchall(),
            "indexes": sorted(
                (name, unique, partial, conn.execute(f"PRAGMA index_info({name})").fetchall())
                for _, name, unique, _, partial in conn.execute(f"PRAGMA index_list({t})")
            ),
        }
    shape["checks"] = sorted(
        " ".join(r[0].split())
        for r in conn.execute(
            "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name != 'schema_migrations'"
        )
        if "CHECK" in r[0] or "WHERE" in r[0]
    )
    conn.close()
    return shape


async def test_sqlite_migrations_equal_schema(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'migrated.db'}")
    await store.open()
    await store.close()
    reference = sqlite3.connect(tmp_path / "reference.db")
    reference.executescript(schema("sqlite"))
    reference.close()
    assert sqlite_shape(tmp_path / "migrated.db") == sqlite_shape(tmp_path / "reference.db")


def pg_shape(conn: psycopg.Connection[Any], schema_name: str) -> dict[str, Any]:
    def rows(sql: str) -> list[Any]:
        return sorted(conn.execute(sql, (schema_name,)).fetchall())

    return {
        "columns": rows(
            "SELECT table_name, column_name, data_type, is_nullable, column_default"
            " FROM information_schema.columns WHERE table_schema = %s"
            " AND table_name != 'schema_migrations'"
        ),
        "indexes": [
            (name, definition.replace(f"{schema_name}.", ""))
            for name, definition in rows(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s"
                " AND tablename != 'schema_migrations'"
            )
        ],
        "constraints": rows(
            "SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)"
            " FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace"
            " WHERE n.nspname = %s AND c.conrelid::regclass::text != 'schema_migrations'"
        ),
    }


async def test_postgres_migrations_equal_schema(pg_url: str, pg_base_url: str) -> None:
    store = open_store(pg_url)
    await store.open()
    await store.close()
    migrated = pg_url.rsplit("%3D", 1)[1]
    reference = migrated + "_ref"
    with psycopg.connect(pg_base_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {reference}")
        try:
            conn.execute(f"SET search_path TO {reference}")
            conn.execute(schema("postgres").encode())
            conn.execute(f"SET search_path TO {migrated}")
            got = pg_shape(conn, migrated)
            conn.execute(f"SET search_path TO {reference}")
            want = pg_shape(conn, reference)
        finally:
            conn.execute(f"DROP SCHEMA {reference} CASCADE")
    assert got["columns"] and got == want


def test_migrations_are_numbered_in_order_and_alike_on_both_backends() -> None:
    # Each area of the code owns a range of numbers (0009-0010, 0011-0012, ...), so a range
    # not used yet leaves a gap; what must hold is one order, no duplicates, both backends alike.
    found = {b: [m.version for m in migrations(b)] for b in ("sqlite", "postgres")}
    for versions in found.values():
        assert versions == sorted(set(versions)) and versions[0] == 1
    assert found["sqlite"] == found["postgres"]
