"""The microVM tier's tables on PostgreSQL: runtime nodes, VMs and named leases.

Times are the database's (``now()``), as for run leases, so replicas and runtime nodes with
skewed clocks agree on who leads and which node is lost.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from lantern.store.postgres.connection import PostgresConnection
from lantern.store.runtime import LIVE_VM_STATES, NamedLease, RuntimeNode, Vm, VmState

_VM_COLUMNS = (
    "vm_id, run_id, node_id, driver, attempt, state, memory_mb, created_at, resume, reason,"
    " exit_code, token_digest, lease_epoch, started_at, ended_at"
)
_LIVE = ", ".join(f"'{s}'" for s in LIVE_VM_STATES)
_LEASE_COLUMNS = "name, holder, epoch, since, expires_at"
_LEADER_HOLDS = (
    "EXISTS (SELECT 1 FROM named_leases WHERE name = %(lname)s AND holder = %(lholder)s"
    " AND epoch = %(lepoch)s AND expires_at > now())"
)


def _vm(r: tuple[Any, ...]) -> Vm:
    return Vm(
        r[0],
        r[1],
        r[2],
        r[3],
        r[4],
        r[5],
        r[6],
        r[7],
        bool(r[8]),
        r[9],
        r[10],
        r[11],
        r[12],
        r[13],
        r[14],
    )


def _lease(r: tuple[Any, ...]) -> NamedLease:
    return NamedLease(r[0], r[1], int(r[2]), r[3], r[4])


def _leader(leader: NamedLease | None) -> dict[str, Any]:
    if leader is None:
        return {"lname": None, "lholder": None, "lepoch": None}
    return {"lname": leader.name, "lholder": leader.holder, "lepoch": leader.epoch}


class Runtime(PostgresConnection):
    async def register_node(self, node: RuntimeNode) -> None:
        await self._fetchall(
            "INSERT INTO runtime_nodes VALUES (%s, %s, %s, %s, %s, %s, now(), NULL)"
            " ON CONFLICT (node_id) DO UPDATE SET driver = excluded.driver,"
            " capacity = excluded.capacity, memory_mb = excluded.memory_mb,"
            " labels = excluded.labels, started_at = excluded.started_at,"
            " heartbeat_at = now(), lost_at = NULL RETURNING node_id",
            (
                node.node_id,
                node.driver,
                node.capacity,
                node.memory_mb,
                Jsonb(node.labels),
                node.started_at,
            ),
        )

    async def heartbeat_node(self, node_id: str) -> None:
        await self._fetchall(
            "UPDATE runtime_nodes SET heartbeat_at = now(), lost_at = NULL WHERE node_id = %s"
            " RETURNING node_id",
            (node_id,),
        )

    async def node_stopped(self, node_id: str) -> None:
        await self._fetchall(
            "UPDATE runtime_nodes SET lost_at = now(), heartbeat_at = 'epoch'"
            " WHERE node_id = %s RETURNING node_id",
            (node_id,),
        )

    async def list_nodes(self) -> list[RuntimeNode]:
        rows = await self._fetchall(
            "SELECT n.node_id, n.driver, n.capacity, n.memory_mb, n.labels, n.started_at,"
            " n.heartbeat_at, n.lost_at, COUNT(v.vm_id), COALESCE(SUM(v.memory_mb), 0)"
            " FROM runtime_nodes n LEFT JOIN runtime_vms v ON v.node_id = n.node_id"
            f" AND v.state IN ({_LIVE}) GROUP BY n.node_id ORDER BY n.node_id"
        )
        return [
            RuntimeNode(
                r[0],
                r[1],
                r[2],
                r[3],
                r[4] if isinstance(r[4], dict) else json.loads(r[4]),
                r[5],
                r[6],
                r[7],
                int(r[8]),
                int(r[9]),
            )
            for r in rows
        ]

    async def acquire_named_lease(self, name: str, holder: str, ttl: float) -> NamedLease | None:
        row = await self._fetchone(
            "INSERT INTO named_leases AS l (name, holder, expires_at, epoch, since)"
            " VALUES (%(name)s, %(holder)s, now() + make_interval(secs => %(ttl)s), 1, now())"
            " ON CONFLICT (name) DO UPDATE SET"
            " epoch = CASE WHEN l.holder = excluded.holder AND l.expires_at > now()"
            "  THEN l.epoch ELSE l.epoch + 1 END,"
            " since = CASE WHEN l.holder = excluded.holder AND l.expires_at > now()"
            "  THEN l.since ELSE now() END,"
            " holder = excluded.holder, expires_at = excluded.expires_at"
            " WHERE l.expires_at <= now() OR l.holder = excluded.holder"
            f" RETURNING {_LEASE_COLUMNS}",
            {"name": name, "holder": holder, "ttl": ttl},
        )
        return None if row is None else _lease(row)

    async def get_named_lease(self, name: str) -> NamedLease | None:
        row = await self._fetchone(
            f"SELECT {_LEASE_COLUMNS} FROM named_leases WHERE name = %s", (name,)
        )
        return None if row is None else _lease(row)

    async def release_named_lease(self, lease: NamedLease) -> None:
        await self._fetchall(
            "UPDATE named_leases SET expires_at = now() WHERE name = %s AND holder = %s"
            " AND epoch = %s RETURNING name",
            (lease.name, lease.holder, lease.epoch),
        )

    async def place_vm(self, leader: NamedLease, vm: Vm) -> bool:
        try:
            return await self._place(leader, vm)
        except psycopg.errors.UniqueViolation:  # the run has a live VM, or this attempt has one
            return False

    async def _place(self, leader: NamedLease, vm: Vm) -> bool:
        rows = await self._fetchall(
            "INSERT INTO runtime_vms (vm_id, run_id, node_id, driver, attempt, state, memory_mb,"
            " created_at, resume) SELECT %(vm_id)s, %(run_id)s, %(node_id)s, %(driver)s,"
            " %(attempt)s, 'scheduled', %(memory_mb)s, now(), %(resume)s"
            f" WHERE {_LEADER_HOLDS} RETURNING vm_id",
            {
                "vm_id": vm.vm_id,
                "run_id": vm.run_id,
                "node_id": vm.node_id,
                "driver": vm.driver,
                "attempt": vm.attempt,
                "memory_mb": vm.memory_mb,
                "resume": vm.resume,
                **_leader(leader),
            },
        )
        return bool(rows)

    async def take_vm(self, vm_id: str, node_id: str, token_digest: str, lease_epoch: int) -> bool:
        rows = await self._fetchall(
            "UPDATE runtime_vms SET state = 'starting', token_digest = %s, lease_epoch = %s,"
            " started_at = now() WHERE vm_id = %s AND node_id = %s AND state = 'scheduled'"
            " RETURNING vm_id",
            (token_digest, lease_epoch, vm_id, node_id),
        )
        return bool(rows)

    async def set_vm_running(self, vm_id: str) -> bool:
        rows = await self._fetchall(
            "UPDATE runtime_vms SET state = 'running' WHERE vm_id = %s AND state = 'starting'"
            " RETURNING vm_id",
            (vm_id,),
        )
        return bool(rows)

    async def end_vm(
        self,
        vm_id: str,
        state: VmState,
        reason: str,
        exit_code: int | None,
        leader: NamedLease | None = None,
    ) -> bool:
        fence = f" AND {_LEADER_HOLDS}" if leader is not None else ""
        rows = await self._fetchall(
            "UPDATE runtime_vms SET state = %(state)s, reason = %(reason)s,"
            " exit_code = %(code)s, ended_at = now()"
            f" WHERE vm_id = %(vm_id)s AND state IN ({_LIVE}){fence} RETURNING vm_id",
            {
                "state": state,
                "reason": reason,
                "code": exit_code,
                "vm_id": vm_id,
                **_leader(leader),
            },
        )
        return bool(rows)

    async def get_vm(self, vm_id: str) -> Vm | None:
        row = await self._fetchone(
            f"SELECT {_VM_COLUMNS} FROM runtime_vms WHERE vm_id = %s", (vm_id,)
        )
        return None if row is None else _vm(row)

    async def run_vms(self, run_id: str) -> list[Vm]:
        rows = await self._fetchall(
            f"SELECT {_VM_COLUMNS} FROM runtime_vms WHERE run_id = %s ORDER BY attempt", (run_id,)
        )
        return [_vm(r) for r in rows]

    async def node_vms(self, node_id: str, *, live: bool = True) -> list[Vm]:
        where = f" AND state IN ({_LIVE})" if live else ""
        rows = await self._fetchall(
            f"SELECT {_VM_COLUMNS} FROM runtime_vms WHERE node_id = %s{where} ORDER BY created_at",
            (node_id,),
        )
        return [_vm(r) for r in rows]

    async def list_vms(self, *, limit: int = 100) -> list[Vm]:
        rows = await self._fetchall(
            f"SELECT {_VM_COLUMNS} FROM runtime_vms ORDER BY created_at DESC LIMIT %s", (limit,)
        )
        return [_vm(r) for r in rows]

    async def runs_needing_vm(self, limit: int) -> list[str]:
        rows = await self._fetchall(
            "SELECT r.id FROM runs r JOIN agents a ON a.workspace = r.workspace"
            " AND a.name = r.agent_name AND a.version = r.agent_version"
            " WHERE r.status IN ('queued', 'running') AND a.definition ? 'runtime'"
            " AND NOT EXISTS (SELECT 1 FROM runtime_vms v WHERE v.run_id = r.id"
            f"  AND v.state IN ({_LIVE}))"
            " AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id"
            "  AND l.expires_at > now())"
            # A queued run under flow control that no claim took yet starts only through
            # the claim, which alone counts its key's slots (docs/flow-control.md).
            " AND NOT (r.status = 'queued' AND r.flow_key IS NOT NULL"
            "  AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id))"
            " ORDER BY r.created_at LIMIT %s",
            (limit,),
        )
        return [r[0] for r in rows]

    async def expire_lease_of(self, run_id: str, holder: str) -> None:
        await self._fetchall(
            "UPDATE run_locks SET expires_at = now() WHERE run_id = %s AND worker_id = %s"
            " AND expires_at > now() RETURNING run_id",
            (run_id, holder),
        )
