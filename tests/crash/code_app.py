"""Code-first agents the real-process tests load with ``--app tests.crash.code_app:app``.

The SIGKILL hook is crash_app's (``LANTERN_TEST_CRASH_AFTER``). ``LANTERN_TEST_SECOND_STEP``
stands for a code change between a crash and the restart that keeps the agent's pinned
version: the ``renamed`` agent's second step is named after it.
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx

import lantern
from tests.crash.crash_app import crash_after, ping

app = lantern.App()
app.on_commit(crash_after)
app.tool("ping")(ping)  # the parity test's tool (it puts its span in the request's traceparent)


async def post(ctx: lantern.Context, url: str, k: int, previous: Any) -> Any:
    """An HTTP step: its idempotency key goes to the receiver with the request."""
    async with httpx.AsyncClient(timeout=60) as http:
        answer = await http.post(
            f"{url}/s{k}",
            json={"step": k, "previous": previous},
            headers={"Idempotency-Key": ctx.idempotency_key},
        )
    answer.raise_for_status()
    return answer.json()


@app.agent("code-chain")
async def code_chain(ctx: lantern.Context, url: str, n: int = 4) -> dict[str, Any]:
    previous = None
    answers = []
    for k in range(1, n + 1):
        previous = await ctx.step(f"s{k}", post, ctx, url, k, previous)
        answers.append(previous)
    return {"answers": answers}


@app.agent("opens")
async def opens(ctx: lantern.Context, url: str) -> Any:
    """One HTTP step: its opening is the run's first commit (tests/crash/test_new_run_crash)."""
    return await ctx.step("s1", post, ctx, url, 1, None)


@app.agent("renamed", version="1")
async def renamed(ctx: lantern.Context, url: str) -> str:
    await ctx.step("s1", post, ctx, url, 1, None)
    await ctx.step(os.environ.get("LANTERN_TEST_SECOND_STEP", "s2"), post, ctx, url, 2, None)
    return "done"


@app.agent("napper")
async def napper(ctx: lantern.Context, seconds: float = 3) -> dict[str, float]:
    before = await ctx.step("before", time.time)
    await ctx.sleep("nap", seconds=seconds)
    after = await ctx.step("after", time.time)
    return {"before": before, "after": after}


@app.agent("publisher")
async def publisher(ctx: lantern.Context, text: str) -> dict[str, Any]:
    draft = await ctx.step("draft", lambda: text.upper())
    verdict = await ctx.approval("publish", prompt=f"Publish {draft!r}?")
    return {"draft": draft, "approved": verdict.approved, "by": verdict.by}


@app.agent("child")
async def child(ctx: lantern.Context, x: int) -> dict[str, int]:
    return {"doubled": await ctx.step("double", lambda: 2 * x)}


@app.agent("parent")
async def parent(ctx: lantern.Context, x: int) -> Any:
    got = await ctx.run_agent("child", {"x": x})
    return {"child": got}


@app.agent("shaped-code")
async def shaped(ctx: lantern.Context, url: str) -> str:
    """The parity test's work as code: a model step, the ping tool, a model step."""
    await ctx.model("gpt-4o-mini", prompt="Say hi to Ada", name="first")
    await ctx.tool("ping", url=url)
    last = await ctx.model("gpt-4o-mini", prompt="Say hi to Ada", name="last")
    return last.text


@app.agent("streamed")
async def streamed(ctx: lantern.Context, text: str) -> str:
    """An approval first (so a follower is in place), then a model step that may retry."""
    await ctx.approval("ok", prompt="Go?")
    retry = {"maxAttempts": 2, "backoffMs": 50, "retryableClasses": ["llm"]}
    reply = await ctx.model("gpt-4o-mini", prompt=text, name="draft", retry=retry)
    return reply.text


# -- the parity test's retried step (tests/crash/test_drive_parity.py) ------------------------


@app.tool("flaky")
async def flaky_tool(ctx: lantern.ToolContext) -> dict[str, Any]:
    """Fails its first two attempts, then answers with its attempt's key."""
    if ctx.attempt < 3:
        raise ConnectionError(f"attempt {ctx.attempt} flaked")
    return {"attempt": ctx.attempt, "key": ctx.idempotency_key}


@app.tool("after")
async def after_tool() -> dict[str, Any]:
    return {"after": True}


@app.agent("flaky-code")
async def flaky_code(ctx: lantern.Context) -> Any:
    def flaky() -> dict[str, Any]:
        if ctx.attempt < 3:
            raise ConnectionError(f"attempt {ctx.attempt} flaked")
        return {"attempt": ctx.attempt, "key": ctx.idempotency_key}

    got = await ctx.step("flaky", flaky, retry={"maxAttempts": 3, "backoffMs": 100})
    await ctx.step("after", lambda: {"after": True})
    return got
