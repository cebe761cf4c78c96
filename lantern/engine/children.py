"""Starting a step's sub-agent: one child run per (run, step, attempt), for every kind of run.

The child's id is the ledger's ``child_id(step, attempt)``, so a re-drive after a crash finds
the child the crash left instead of starting a second one (the create is idempotent on it).
A graph's sub-agent node, a code-first ``ctx.run_agent`` and a microVM's ``run_agent`` call
all start their child here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lantern.app import App
from lantern.engine.runs import create_run
from lantern.errors import Conflict, NotFound, StepError, UsageError
from lantern.store.base import Store
from lantern.store.records import Run


async def start_child(
    store: Store,
    app: App | None,
    parent: Run,
    child_id: str,
    agent: str,
    input: Any,
    on_queued: Callable[[], None],
) -> str:
    """Create the child run ``child_id`` of ``parent`` (or find it), then tell the process
    there is work; a StepError (class ``tool``) when it cannot be started: among others
    under a chain of MAX_SUBAGENT_DEPTH runs or an ancestor being cancelled, which
    ``create_run`` checks for every kind of parent run."""
    try:
        await create_run(
            store,
            agent,
            input,
            parent.workspace,
            idempotency_key=f"subagent:{child_id}",
            run_id=child_id,
            parent_id=parent.id,
            app=app,
        )
    except (NotFound, UsageError, Conflict) as exc:
        raise StepError(f"sub-agent {agent!r}: {exc}", error_class="tool") from exc
    on_queued()
    return child_id
