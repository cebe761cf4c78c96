"""Workloads that make deliveries and stream text from inside a VM (ctx.deliver_once and
ctx.live_text, performed through the control plane)."""

import secrets
from typing import Any

from lantern.workload import Context, entrypoint

SENT: list[dict[str, Any]] = []  # every dispatch this VM made


def _dispatch(where: str, attempt: int) -> dict[str, Any]:
    sent = {"to": where, "attempt": attempt, "token": secrets.token_hex(4)}
    SENT.append(sent)
    return sent


@entrypoint
async def delivers(ctx: Context) -> dict[str, Any]:
    """A delivery between steps (a step of its own), and one inside a step whose first attempt
    fails after it delivered: the second attempt gets the recorded answer, no dispatch."""
    notice = await ctx.deliver_once(
        "notice",
        lambda: _dispatch("https://hooks.example/notice", 1),
        to="https://hooks.example/notice",
    )

    async def send_receipt() -> dict[str, Any]:
        attempt = ctx.attempt
        answer = await ctx.deliver_once(
            "receipt",
            lambda: _dispatch("mailto:ada@example.com", attempt),
            to="mailto:ada@example.com",
        )
        if attempt == 1:
            raise ConnectionError("the step failed after its delivery went out")
        return {"answer": answer, "attempt": attempt}

    retry = {"maxAttempts": 2, "backoffMs": 10}
    receipt = await ctx.step("send", send_receipt, retry=retry)
    return {"notice": notice, "receipt": receipt, "sent": SENT}


@entrypoint
async def streams(ctx: Context, words: str) -> dict[str, Any]:
    """After an approval (so a follower is in place), a step writes its text piece by piece
    to ctx.live_text, as an integration wrapping a model would."""
    await ctx.approval("go", prompt="Go?")

    def write() -> dict[str, Any]:
        with ctx.live_text() as sink:
            if sink is not None:
                for word in words.split():
                    sink(word + " ")
            return {"streamed": sink is not None, "text": words}

    written: dict[str, Any] = await ctx.step("write", write)
    return written
