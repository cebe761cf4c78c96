"""How the microVM tier writes the journal: through THE fenced commit every drive uses.

A VM never writes: its runtime node relays its reports and the control plane commits them
with ``lantern.engine.commits.commit`` (the commit ``Drive.commit`` makes: the fenced append,
sent again across a database blink, its metrics, the run's log lines and the commit
listeners), fenced on the run lease the node holds (its epoch is on the VM's row), so a VM
whose node was thought lost, or any VM that is not the run's live one, cannot write a thing.
"""

from __future__ import annotations

from typing import Any

from lantern.engine.journal import EventWriter
from lantern.store.base import Store


async def writer(store: Store, run_id: str) -> EventWriter:
    """An event writer positioned after the run's last event."""
    count, head = await store.journal_head(run_id)
    return EventWriter(run_id, count, head) if head else EventWriter(run_id, count)


def vm_data(vm: Any, **more: Any) -> dict[str, Any]:
    """What every vm_* event carries."""
    return {"vmId": vm.vm_id, "nodeId": vm.node_id, "attempt": vm.attempt, **more}
