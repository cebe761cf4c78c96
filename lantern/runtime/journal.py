"""How the microVM tier writes the journal: through the store's fenced append, as every drive.

(The drive discipline of every run kind is moving into one module, ``engine/drive.py``; until
it lands, this is the runner's ``_commit`` for reports: the append, its metrics and the commit
listeners, nothing more.)

A VM never writes: its runtime node relays its reports and the control plane commits them
here, fenced on the run lease the node holds (its epoch is on the VM's row), so a VM whose
node was thought lost, or any VM that is not the run's live one, cannot write a thing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from lantern.engine.journal import EventWriter, count_committed
from lantern.observability import metrics
from lantern.store.base import Store
from lantern.store.records import Append, Lease, NewEvent, RunUpdate

Listener = Callable[[str, Sequence[NewEvent]], None]


async def writer(store: Store, run_id: str) -> EventWriter:
    """An event writer positioned after the run's last event."""
    count, head = await store.journal_head(run_id)
    return EventWriter(run_id, count, head) if head else EventWriter(run_id, count)


async def commit(
    store: Store,
    lease: Lease,
    events: Sequence[NewEvent],
    update: RunUpdate | None = None,
    listeners: Sequence[Listener] = (),
) -> None:
    """One fenced commit (LeaseLost when the lease's epoch is no longer current)."""
    started = time.perf_counter()
    await store.append(Append(lease, tuple(events), update))
    metrics.JOURNAL_WRITE.observe(time.perf_counter() - started)
    count_committed(events)
    for listener in listeners:
        listener(lease.run_id, events)


def vm_data(vm: Any, **more: Any) -> dict[str, Any]:
    """What every vm_* event carries (CONTRACT §7)."""
    return {"vmId": vm.vm_id, "nodeId": vm.node_id, "attempt": vm.attempt, **more}
