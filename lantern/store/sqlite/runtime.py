"""The microVM tier's tables on SQLite: runtime nodes, VMs and named leases."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from lantern.store.runtime import LIVE_VM_STATES, NamedLease, RuntimeNode, Vm, VmState
from lantern.store.sqlite.connection import SQLiteConnection
from lantern.store.sqlite.rows import _time

_VM_COLUMNS = (
    "vm_id, run_id, node_id, driver, attempt, state, memory_mb, created_at, resume, reason,"
    " exit_code, token_digest, lease_epoch, started_at, ended_at"
)
_LIVE = ", ".join(f"'{s}'" for s in LIVE_VM_STATES)


def _opt(value: float | None) -> Any:
    return None if value is None else _time(value)


def _vm(r: sqlite3.Row | tuple[Any, ...]) -> Vm:
    return Vm(
        r[0],
        r[1],
        r[2],
        r[3],
        r[4],
        r[5],
        r[6],
        _time(r[7]),
        bool(r[8]),
        r[9],
        r[10],
        r[11],
        r[12],
        _opt(r[13]),
        _opt(r[14]),
    )


def _leader_holds(conn: sqlite3.Connection, leader: NamedLease | None) -> bool:
    if leader is None:
        return True
    row = conn.execute(
        "SELECT 1 FROM named_leases WHERE name = ? AND holder = ? AND epoch = ? AND expires_at > ?",
        (leader.name, leader.holder, leader.epoch, time.time()),
    ).fetchone()
    return row is not None


class Runtime(SQLiteConnection):
    async def register_node(self, node: RuntimeNode) -> None:
        sql = (
            "INSERT INTO runtime_nodes VALUES (?, ?, ?, ?, ?, ?, ?, NULL) ON CONFLICT (node_id)"
            " DO UPDATE SET driver = excluded.driver, capacity = excluded.capacity,"
            " memory_mb = excluded.memory_mb, labels = excluded.labels,"
            " started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at,"
            " lost_at = NULL"
        )
        now = time.time()
        args = (
            node.node_id,
            node.driver,
            node.capacity,
            node.memory_mb,
            json.dumps(node.labels),
            node.started_at.timestamp(),
            now,
        )
        await self._write(lambda c: c.execute(sql, args))

    async def heartbeat_node(self, node_id: str) -> None:
        sql = "UPDATE runtime_nodes SET heartbeat_at = ?, lost_at = NULL WHERE node_id = ?"
        args = (time.time(), node_id)
        await self._write(lambda c: c.execute(sql, args))

    async def node_stopped(self, node_id: str) -> None:
        sql = "UPDATE runtime_nodes SET lost_at = ?, heartbeat_at = 0 WHERE node_id = ?"
        args = (time.time(), node_id)
        await self._write(lambda c: c.execute(sql, args))

    async def list_nodes(self) -> list[RuntimeNode]:
        sql = (
            "SELECT n.node_id, n.driver, n.capacity, n.memory_mb, n.labels, n.started_at,"
            " n.heartbeat_at, n.lost_at, COUNT(v.vm_id), COALESCE(SUM(v.memory_mb), 0)"
            " FROM runtime_nodes n LEFT JOIN runtime_vms v ON v.node_id = n.node_id"
            f" AND v.state IN ({_LIVE}) GROUP BY n.node_id ORDER BY n.node_id"
        )
        rows = await self._read(lambda c: c.execute(sql).fetchall())
        return [
            RuntimeNode(
                r[0],
                r[1],
                r[2],
                r[3],
                json.loads(r[4]),
                _time(r[5]),
                _time(r[6]),
                _opt(r[7]),
                r[8],
                r[9],
            )
            for r in rows
        ]

    # -- named leases: the run_locks UPSERT, keyed by name ---------------------------------

    async def acquire_named_lease(self, name: str, holder: str, ttl: float) -> NamedLease | None:
        sql = (
            "INSERT INTO named_leases (name, holder, expires_at, epoch, since)"
            " VALUES (?, ?, ?, 1, ?) ON CONFLICT (name) DO UPDATE SET"
            " epoch = CASE WHEN named_leases.holder = excluded.holder"
            "  AND named_leases.expires_at > ? THEN named_leases.epoch"
            "  ELSE named_leases.epoch + 1 END,"
            " since = CASE WHEN named_leases.holder = excluded.holder"
            "  AND named_leases.expires_at > ? THEN named_leases.since ELSE excluded.since END,"
            " holder = excluded.holder, expires_at = excluded.expires_at"
            " WHERE named_leases.expires_at <= ? OR named_leases.holder = excluded.holder"
            " RETURNING name, holder, epoch, since, expires_at"
        )

        def tx(conn: sqlite3.Connection) -> NamedLease | None:
            now = time.time()
            row = conn.execute(sql, (name, holder, now + ttl, now, now, now, now)).fetchone()
            if row is None:
                return None
            return NamedLease(row[0], row[1], row[2], _time(row[3]), _time(row[4]))

        return await self._write(tx)

    async def get_named_lease(self, name: str) -> NamedLease | None:
        sql = "SELECT name, holder, epoch, since, expires_at FROM named_leases WHERE name = ?"
        row = await self._read(lambda c: c.execute(sql, (name,)).fetchone())
        if row is None:
            return None
        return NamedLease(row[0], row[1], row[2], _time(row[3]), _time(row[4]))

    async def release_named_lease(self, lease: NamedLease) -> None:
        sql = "UPDATE named_leases SET expires_at = ? WHERE name = ? AND holder = ? AND epoch = ?"
        args = (time.time(), lease.name, lease.holder, lease.epoch)
        await self._write(lambda c: c.execute(sql, args))

    # -- VMs -------------------------------------------------------------------------------

    async def place_vm(self, leader: NamedLease, vm: Vm) -> bool:
        sql = (
            "INSERT INTO runtime_vms (vm_id, run_id, node_id, driver, attempt, state, memory_mb,"
            " created_at, resume) VALUES (?, ?, ?, ?, ?, 'scheduled', ?, ?, ?)"
        )

        def tx(conn: sqlite3.Connection) -> bool:
            if not _leader_holds(conn, leader):
                return False
            try:
                conn.execute(
                    sql,
                    (
                        vm.vm_id,
                        vm.run_id,
                        vm.node_id,
                        vm.driver,
                        vm.attempt,
                        vm.memory_mb,
                        vm.created_at.timestamp(),
                        vm.resume,
                    ),
                )
            except sqlite3.IntegrityError:  # the run has a live VM, or this attempt has one
                return False
            return True

        return await self._write(tx)

    async def take_vm(self, vm_id: str, node_id: str, token_digest: str, lease_epoch: int) -> bool:
        sql = (
            "UPDATE runtime_vms SET state = 'starting', token_digest = ?, lease_epoch = ?,"
            " started_at = ? WHERE vm_id = ? AND node_id = ? AND state = 'scheduled'"
        )
        args = (token_digest, lease_epoch, time.time(), vm_id, node_id)
        return bool(await self._write(lambda c: c.execute(sql, args).rowcount))

    async def set_vm_running(self, vm_id: str) -> bool:
        sql = "UPDATE runtime_vms SET state = 'running' WHERE vm_id = ? AND state = 'starting'"
        return bool(await self._write(lambda c: c.execute(sql, (vm_id,)).rowcount))

    async def end_vm(
        self,
        vm_id: str,
        state: VmState,
        reason: str,
        exit_code: int | None,
        leader: NamedLease | None = None,
    ) -> bool:
        sql = (
            "UPDATE runtime_vms SET state = ?, reason = ?, exit_code = ?, ended_at = ?"
            f" WHERE vm_id = ? AND state IN ({_LIVE})"
        )

        def tx(conn: sqlite3.Connection) -> bool:
            if not _leader_holds(conn, leader):
                return False
            args = (state, reason, exit_code, time.time(), vm_id)
            return bool(conn.execute(sql, args).rowcount)

        return await self._write(tx)

    async def get_vm(self, vm_id: str) -> Vm | None:
        sql = f"SELECT {_VM_COLUMNS} FROM runtime_vms WHERE vm_id = ?"
        row = await self._read(lambda c: c.execute(sql, (vm_id,)).fetchone())
        return None if row is None else _vm(row)

    async def run_vms(self, run_id: str) -> list[Vm]:
        sql = f"SELECT {_VM_COLUMNS} FROM runtime_vms WHERE run_id = ? ORDER BY attempt"
        rows = await self._read(lambda c: c.execute(sql, (run_id,)).fetchall())
        return [_vm(r) for r in rows]

    async def node_vms(self, node_id: str, *, live: bool = True) -> list[Vm]:
        where = f" AND state IN ({_LIVE})" if live else ""
        sql = f"SELECT {_VM_COLUMNS} FROM runtime_vms WHERE node_id = ?{where} ORDER BY created_at"
        rows = await self._read(lambda c: c.execute(sql, (node_id,)).fetchall())
        return [_vm(r) for r in rows]

    async def list_vms(self, *, limit: int = 100) -> list[Vm]:
        sql = f"SELECT {_VM_COLUMNS} FROM runtime_vms ORDER BY created_at DESC LIMIT ?"
        rows = await self._read(lambda c: c.execute(sql, (limit,)).fetchall())
        return [_vm(r) for r in rows]

    async def runs_needing_vm(self, limit: int) -> list[str]:
        sql = (
            "SELECT r.id FROM runs r JOIN agents a ON a.workspace = r.workspace"
            " AND a.name = r.agent_name AND a.version = r.agent_version"
            " WHERE r.status IN ('queued', 'running')"
            " AND json_extract(a.definition, '$.runtime') IS NOT NULL"
            f" AND NOT EXISTS (SELECT 1 FROM runtime_vms v WHERE v.run_id = r.id"
            f"  AND v.state IN ({_LIVE}))"
            " AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id"
            "  AND l.expires_at > ?)"
            # A queued run under flow control that no claim took yet starts only through
            # the claim, which alone counts its key's slots (docs/flow-control.md).
            " AND NOT (r.status = 'queued' AND r.flow_key IS NOT NULL"
            "  AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id))"
            " ORDER BY r.created_at LIMIT ?"
        )
        rows = await self._read(lambda c: c.execute(sql, (time.time(), limit)).fetchall())
        return [r[0] for r in rows]

    async def expire_lease_of(self, run_id: str, holder: str) -> None:
        sql = (
            "UPDATE run_locks SET expires_at = ? WHERE run_id = ? AND worker_id = ?"
            " AND expires_at > ?"
        )
        now = time.time()
        await self._write(lambda c: c.execute(sql, (now, run_id, holder, now)))
