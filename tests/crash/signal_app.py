"""Code-first agents that wait for signals, for the real-process tests of docs/signals.md
(``--app tests.crash.signal_app:app``); the SIGKILL hook is crash_app's."""

from __future__ import annotations

from typing import Any

import lantern
from tests.crash.crash_app import crash_after, noop

app = lantern.App()
app.on_commit(crash_after)
app.tool("noop")(noop)  # the graph agents' tool


@app.agent("await-payment")
async def await_payment(ctx: lantern.Context) -> dict[str, Any]:
    """Payments sent before the run waits for them are kept, and taken in order."""
    await ctx.wait_for_signal("start")
    first = await ctx.wait_for_signal("payment")
    second = await ctx.wait_for_signal("payment")
    late = await ctx.wait_for_signal("never", timeout_s=0.3)
    return {"payments": [first, second], "late": late}


@app.agent("await-blocking")
def await_blocking(ctx: Any) -> Any:
    """A plain ``def`` agent waits the same way (its Context blocks)."""
    return ctx.wait_for_signal("go")


@app.agent("pay-once")
async def pay_once(ctx: lantern.Context) -> dict[str, Any]:
    paid = await ctx.wait_for_signal("pay")
    return {"paid": paid, "after": await ctx.step("after", lambda: "done")}
