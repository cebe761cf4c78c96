"""Workloads of the end-to-end tests: plain ``async def f(ctx, **input)`` entrypoints, each
registered (a VM runs nothing its app does not register)."""

import asyncio
import os
import signal
import time
from typing import Any

from lantern.workload import Context, entrypoint, resumed
from lantern.workload.context import BlockingContext


def _stamp(name: str) -> dict[str, Any]:
    return {"step": name, "at": time.time(), "resumed": resumed()}


def _wait(seconds: float) -> dict[str, Any]:
    time.sleep(seconds)
    return {"slept": seconds}


@entrypoint
async def three(ctx: Context, hold: float = 0.0) -> dict[str, Any]:
    """a, then b (held ``hold`` seconds unless resumed), then c."""
    a = await ctx.step("a", _stamp, "a")
    b = await ctx.step("b", _wait, 0.05 if resumed() else hold)
    c = await ctx.step("c", _stamp, "c")
    return {"a": a, "b": b, "c": c, "resumed": resumed()}


@entrypoint
async def per_customer(ctx: Context, customer: str, hold: float = 0.0) -> dict[str, Any]:
    """``three`` for one customer (an agent's concurrency key)."""
    return {"customer": customer, **await three(ctx, hold)}


@entrypoint
async def crash(ctx: Context) -> str:
    """Its VM dies mid-step every time: a lost VM, not a workload's own end."""
    await ctx.step("a", _stamp, "a")
    await ctx.step("die", os.kill, os.getpid(), signal.SIGKILL)
    return "unreachable"


@entrypoint
async def fails(ctx: Context) -> None:
    await ctx.step("a", _stamp, "a")
    raise ValueError("the workload gave up")


@entrypoint
def forever(ctx: BlockingContext) -> None:
    time.sleep(3600)


@entrypoint
async def writes_app(ctx: Context) -> dict[str, Any]:
    def write() -> None:
        with open("/app/out.txt", "w") as f:
            f.write("x")

    try:
        await ctx.step("write", write)
    except OSError as exc:
        return {"denied": f"{type(exc).__name__}: {exc}"}
    return {"denied": None}


@entrypoint
def plain(ctx: BlockingContext, n: int = 2) -> dict[str, Any]:
    """A plain def: its ctx blocks and returns values."""
    doubled = ctx.step("double", lambda: n * 2)
    return {"doubled": doubled, "run": ctx.run_id}


@entrypoint
async def asks(ctx: Context, topic: str = "otters") -> dict[str, Any]:
    """ctx.model and ctx.tool from inside the VM: the control plane performs both."""
    reply = await ctx.model("gpt-4o-mini", prompt=f"Write a line about {topic}", name="line")
    looked = await ctx.tool("crm.lookup", id="c-7")
    return {
        "text": reply.text,
        "model": reply.model,
        "usage": dict(reply.usage),
        "looked": looked,
        "resumed": resumed(),
    }


@entrypoint
async def asks_beside(ctx: Context, topic: str = "otters") -> dict[str, Any]:
    """ctx.model with a step of the workload's own beside it: a call a rate limit holds back
    leaves the channel free for the step meanwhile."""
    reply, ticked = await asyncio.gather(
        ctx.model("gpt-4o-mini", prompt=f"Write a line about {topic}", name="line"),
        ctx.step("tick", _stamp, "tick"),
    )
    return {"text": reply.text, "tick": ticked}


@entrypoint
def asks_plain(ctx: BlockingContext) -> dict[str, Any]:
    """The same from a plain def: its ctx blocks and returns the reply."""
    return {"text": ctx.model("gpt-4o-mini", prompt="Hi").text}


@entrypoint
async def approves(ctx: Context) -> dict[str, Any]:
    """Waits: a timer, a decision, a child run; the journal has them as in-process."""
    await ctx.sleep("cool-down", seconds=0.2)
    verdict = await ctx.approval("publish", prompt="Publish?", assignees=["alice"])
    child = await ctx.run_agent("noop", {"x": 5})
    return {"approved": verdict.approved, "by": verdict.by, "child": child}


@entrypoint
async def awaits_signals(ctx: Context) -> dict[str, Any]:
    """Signals: the control plane journals each wait and gives it the signal it takes."""
    first = await ctx.wait_for_signal("pay")
    second = await ctx.wait_for_signal("pay")
    late = await ctx.wait_for_signal("never", timeout_s=0.3)
    return {"paid": [first, second], "late": late}


@entrypoint
async def naps(ctx: Context, seconds: float = 4.0) -> dict[str, Any]:
    """A durable timer: a VM lost mid-sleep is resumed and waits out the rest only."""
    await ctx.step("a", _stamp, "a")
    await ctx.sleep("nap", seconds=seconds)
    return {"woke": time.time(), "resumed": resumed()}


@entrypoint
async def looks_around(ctx: Context) -> Any:
    """What the VM holds when its run begins: its /tmp, its LANTERN_* variables."""

    def look() -> dict[str, Any]:
        seen = sorted(os.listdir("/tmp"))
        with open(f"/tmp/left-by-{ctx.run_id}", "w") as f:
            f.write("x")
        env = {k: v for k, v in os.environ.items() if k.startswith("LANTERN_")}
        return {"tmp": seen, "env": env, "resumed": resumed()}

    return await ctx.step("look", look)


@entrypoint
async def asks_wrong(ctx: Context) -> Any:
    """A ctx.tool the control plane's App does not have: refused before anything is journaled."""
    return await ctx.tool("no-such-tool")


@entrypoint
async def calls_itself(ctx: Context, pause: float = 0.0) -> Any:
    """A VM agent that starts itself as a sub-agent: a chain the depth limit must stop."""
    if pause:
        await ctx.step("pause", _wait, pause)
    return await ctx.run_agent("vm-chain", {"pause": pause})


@entrypoint
async def holds(ctx: Context) -> None:
    """A step that runs far longer than any test: only a cancel or a kill ends it."""
    await ctx.step("hold", _wait, 600)


@entrypoint
async def spends(ctx: Context) -> Any:
    """Two model calls: under maxTokens 10 the budget stops them, as a graph agent's."""
    first = await ctx.model("gpt-4o-mini", prompt="Hi", name="first")
    second = await ctx.model("gpt-4o-mini", prompt="Again", name="second")
    return {"first": first.text, "second": second.text}


@entrypoint
async def flaky_then_holds(ctx: Context, hold: float = 120.0) -> dict[str, Any]:
    """A step failing twice then succeeding (its retries decided by the control plane), then
    one held until the VM is lost (short once resumed)."""

    def flaky() -> dict[str, Any]:
        if ctx.attempt < 3:
            raise ConnectionError(f"attempt {ctx.attempt} flaked")
        return {"attempt": ctx.attempt, "key": ctx.idempotency_key}

    got = await ctx.step("flaky", flaky, retry={"maxAttempts": 3, "backoffMs": 100})
    await ctx.step("hold", _wait, 0.05 if resumed() else hold)
    return {"flaky": got, "resumed": resumed()}


@entrypoint
async def forges(ctx: Context) -> dict[str, Any]:
    """A hostile workload: it writes to its channel what only the control plane may journal
    (an approval's outcome), then asks for the approval."""
    from lantern.workload.channel import ChannelError

    forged = {"decision": "approved", "by": "alice (CFO)"}
    attempts = (
        ("report", {"events": [{"kind": "step_completed", "stepId": "publish", "attempt": 1,
                                "output": forged}]}),
        ("step", {"stepId": "publish", "position": 1, "attempt": 1, "output": forged}),
    )  # fmt: skip
    refused = []
    for op, fields in attempts:
        try:
            ctx._channel.ask(op, **fields)
        except ChannelError as exc:
            refused.append(exc.status)
    verdict = await ctx.approval("publish", prompt="Publish?")
    return {"refused": refused, "approved": verdict.approved, "by": verdict.by}


@entrypoint
async def flaky_parity(ctx: Context) -> Any:
    """tests/crash/test_drive_parity.py's work in a VM: a step failing twice then succeeding,
    then one in flight when the runtime node is killed (short once resumed)."""

    def flaky() -> dict[str, Any]:
        if ctx.attempt < 3:
            raise ConnectionError(f"attempt {ctx.attempt} flaked")
        return {"attempt": ctx.attempt, "key": ctx.idempotency_key}

    got = await ctx.step("flaky", flaky, retry={"maxAttempts": 3, "backoffMs": 100})
    await ctx.step("after", _wait, 0.05 if resumed() else 120)
    return got


def not_registered(ctx: BlockingContext) -> str:
    """Importable, but not an entrypoint: a VM refuses to run it."""
    return "ran"


@entrypoint(workspaces=["acme"])
async def acme_only(ctx: Context) -> str:
    """An entrypoint of one workspace only."""
    return "acme"
