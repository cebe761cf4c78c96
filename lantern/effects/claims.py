"""Deliveries exactly once: claim a side_effect_receipts row before dispatching, record the
outcome after.

A re-drive that reaches a delivered receipt returns the recorded answer and dispatches
nothing. A receipt left claimed with no outcome (the crash hit mid-delivery) is dispatched
again with the same idempotency key (and, for email, the same Message-ID): exactly once for
receivers that de-duplicate by key, at least once — and never more than once per crash — for
the rest. Claims and outcomes are fenced by the run's lease, so a replica that lost the run
cannot dispatch.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from lantern.errors import StepError
from lantern.observability import metrics
from lantern.store.base import Store
from lantern.store.codec import value_problem
from lantern.store.records import Delivery, Lease

Dispatch = Callable[[], Awaitable[Any] | Any]


class Deliveries:
    """The claimed deliveries of one step attempt."""

    def __init__(
        self,
        store: Store,
        lease: Lease,
        *,
        step_id: str,
        attempt: int,
        idempotency_key: str,
    ) -> None:
        self.store = store
        self.lease = lease
        self.step_id = step_id
        self.attempt = attempt
        self.idempotency_key = idempotency_key

    async def once(
        self, name: str, dispatch: Dispatch, *, kind: str = "tool", target: str | None = None
    ) -> Any:
        """Dispatch ``name`` unless this step already delivered it; return the answer."""
        claim = Delivery(
            run_id=self.lease.run_id,
            step_id=self.step_id,
            name=name,
            attempt=self.attempt,
            idempotency_key=self.idempotency_key,
            kind=kind,
            target=target,
        )
        receipt = await self.store.claim_delivery(self.lease, claim)
        if receipt.status == "delivered":
            metrics.delivery(kind, "replayed")
            return receipt.response
        try:
            answer = dispatch()
            if inspect.isawaitable(answer):
                answer = await answer
        except Exception as exc:
            error = exc.to_json() if isinstance(exc, StepError) else {"message": str(exc)}
            await self.store.finish_delivery(self.lease, receipt, "failed", error)
            metrics.delivery(kind, "failed")
            raise
        problem = value_problem(answer)
        if problem is not None:
            # It went out; what came back cannot be kept. Record that much and fail the step.
            await self.store.finish_delivery(self.lease, receipt, "delivered", None)
            metrics.delivery(kind, "unstorable")
            raise StepError(
                f"delivery {name!r}: its answer cannot be stored: {problem}", error_class="tool"
            )
        await self.store.finish_delivery(self.lease, receipt, "delivered", answer)
        metrics.delivery(kind, "delivered")
        return answer
