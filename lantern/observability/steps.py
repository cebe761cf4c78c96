"""One step attempt, observed: its duration and model usage (metrics), and its span (traces).

The runner runs every executor through ``observed`` as the step task's coroutine, so the
step's span is the current one for everything the step does (``traceparent`` on its requests).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from lantern.nodes.base import Noted
from lantern.observability import metrics, tracing

if TYPE_CHECKING:
    from lantern.nodes.base import NodeExecutor, StepContext


async def observed(execute: NodeExecutor, ctx: StepContext) -> Any:
    span = tracing.start_step(ctx)
    started = time.perf_counter()
    try:
        output = await execute(ctx)
    except BaseException as exc:
        metrics.step_duration(ctx.node.type, time.perf_counter() - started)
        if span is not None:
            span.failed(exc)
        raise
    metrics.step_duration(ctx.node.type, time.perf_counter() - started)
    answer = output.value if isinstance(output, Noted) else output  # a gated answer
    metrics.model_usage(answer)
    if span is not None:
        span.succeeded(answer)
    return output
