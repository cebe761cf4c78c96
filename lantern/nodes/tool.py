"""A tool node calls one of the user's registered Python functions with rendered args."""

from __future__ import annotations

from typing import Any

from lantern.errors import LanternError, StepError
from lantern.nodes.base import StepContext
from lantern.observability import logs


async def execute(ctx: StepContext) -> Any:
    name = ctx.node.data["tool"]
    tool = await ctx.tools.find(name)
    if tool is None:
        raise StepError(
            f"tool {name!r} is not registered in this process (load it with --app MODULE:OBJECT)",
            error_class="tool",
        )
    args = ctx.render("args", {})
    try:
        return await tool.call(ctx.tool_context(), args)
    except LanternError:
        raise
    except TypeError as exc:
        logs.tool_raised(name, ctx.run_id, ctx.step_id, exc)  # its own TypeError, perhaps
        raise StepError(f"tool {name!r} rejected its arguments: {exc}", error_class="tool") from exc
    except Exception as exc:
        logs.tool_raised(name, ctx.run_id, ctx.step_id, exc)
        # An exception may be transient (a timeout, a busy peer): a retry policy naming the
        # tool class retries it. A tool raises lantern.StepError itself to say otherwise.
        raise StepError(
            f"tool {name!r} failed: {type(exc).__name__}: {exc}",
            error_class="tool",
            retryable=True,
        ) from exc
