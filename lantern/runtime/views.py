"""The microVM tier's records as the API shows them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from lantern.store.runtime import NamedLease, RuntimeNode, Vm


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def vm_json(vm: Vm) -> dict[str, Any]:
    return {
        "vmId": vm.vm_id,
        "runId": vm.run_id,
        "nodeId": vm.node_id,
        "driver": vm.driver,
        "attempt": vm.attempt,
        "state": vm.state,
        "reason": vm.reason,
        "exitCode": vm.exit_code,
        "resume": vm.resume,
        "memoryMb": vm.memory_mb,
        "createdAt": _iso(vm.created_at),
        "startedAt": _iso(vm.started_at),
        "endedAt": _iso(vm.ended_at),
    }


def node_json(node: RuntimeNode, ttl: float) -> dict[str, Any]:
    return {
        "nodeId": node.node_id,
        "driver": node.driver,
        "capacity": node.capacity,
        "memoryMb": node.memory_mb,
        "running": node.running,
        "labels": node.labels,
        "heartbeatAt": _iso(node.heartbeat_at),
        "state": node.state(datetime.now(UTC), ttl),
    }


def scheduler_json(lease: NamedLease | None) -> dict[str, Any]:
    live = lease is not None and lease.expires_at > datetime.now(UTC)
    return {
        "leader": lease.holder if live and lease else None,
        "epoch": lease.epoch if lease else 0,
        "since": _iso(lease.since) if live and lease else None,
    }
