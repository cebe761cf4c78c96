"""The harness's package: standard library only, and its Context serves completed steps."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

from lantern.runtime.drivers.base import BOOT
from lantern.workload.context import Context, idempotency_key


def test_the_harness_imports_nothing_of_lantern_but_itself() -> None:
    probe = BOOT.replace(
        "sys.exit(main())",
        "print(sorted(m for m in sys.modules if m.startswith(('lantern', 'httpx', 'pydantic'))))",
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    names = eval(out)  # a list literal printed by the child
    assert all(n == "lantern" or n.startswith("lantern.workload") for n in names), names


class Recorder:
    """A control plane of the test's own: a step runs attempt 1 and its outcome stands."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, dict[str, Any]]] = []

    def ask(self, op: str, **fields: Any) -> Any:
        self.asked.append((op, fields))
        if op != "step":
            return None
        if "output" in fields:
            return {"output": fields["output"]}
        if "error" in fields:
            return {"error": fields["error"]}
        return {"attempt": 1}

    def steps(self) -> list[tuple[str, str]]:
        """(what was asked, the step) for each step question: enter, output or error."""
        found = []
        for op, f in self.asked:
            if op == "step":
                what = "output" if "output" in f else "error" if "error" in f else "enter"
                found.append((what, f["stepId"]))
        return found


def test_completed_steps_are_served_and_not_run() -> None:
    calls: list[str] = []

    def fetch(x: int) -> int:
        calls.append("fetch")
        return x * 2

    async def work(ctx: Context) -> list[Any]:
        a = await ctx.step("fetch", fetch, 1)
        b = await ctx.step("fetch", fetch, 2)  # fetch#2: not completed yet
        return [a, b]

    channel = Recorder()
    ctx = Context(channel, "run-1", {"fetch": 99})
    assert asyncio.run(work(ctx)) == [99, 4]
    assert calls == ["fetch"]
    assert channel.steps() == [("enter", "fetch#2"), ("output", "fetch#2")]
    assert channel.asked[-1][1]["output"] == 4 and channel.asked[-1][1]["attempt"] == 1


def test_a_step_sees_its_key_and_a_failure_is_reported() -> None:
    keys: list[str] = []

    def boom() -> None:
        keys.append(ctx.idempotency_key)
        raise PermissionError("no")

    channel = Recorder()
    ctx = Context(channel, "run-1")

    async def work() -> None:
        await ctx.step("write", boom)

    try:
        asyncio.run(work())
    except PermissionError:
        pass
    else:
        raise AssertionError("the step's own error reaches the workload")
    assert keys == [idempotency_key("run-1", "write", 1)]
    failed = channel.asked[-1][1]
    assert channel.steps()[-1] == ("error", "write")
    assert "PermissionError" in failed["error"]["message"] and failed["error"]["retryable"]


def test_the_control_plane_decides_a_retry_and_the_harness_keeps_no_loop_of_its_own() -> None:
    """The harness proposes an attempt's error; the control plane answers retry, then which
    attempt to run when: the harness runs what it is told, each attempt under its own key."""
    keys: list[str] = []

    class Retrying(Recorder):
        def ask(self, op: str, **fields: Any) -> Any:
            self.asked.append((op, fields))
            if "error" in fields:
                return {"retry": {"attempt": fields["attempt"] + 1, "dueAt": 0}}
            if "output" in fields:
                return {"output": fields["output"]}
            errors = sum(1 for _, f in self.asked if "error" in f)
            return {"attempt": errors + 1}

    def flaky() -> str:
        keys.append(ctx.idempotency_key)
        if ctx.attempt < 3:
            raise ConnectionError("flaked")
        return "ok"

    channel = Retrying()
    ctx = Context(channel, "run-1")

    async def work() -> Any:
        return await ctx.step("flaky", flaky, retry={"maxAttempts": 5, "backoffMs": 1})

    assert asyncio.run(work()) == "ok"
    assert keys == [idempotency_key("run-1", "flaky", k) for k in (1, 2, 3)]
    assert channel.steps() == [
        ("enter", "flaky"), ("error", "flaky"), ("enter", "flaky"), ("error", "flaky"),
        ("enter", "flaky"), ("output", "flaky"),
    ]  # fmt: skip
    assert all(f["retry"] == {"maxAttempts": 5, "backoffMs": 1} for _, f in channel.asked)


def test_a_plain_def_workload_gets_a_blocking_context() -> None:
    from lantern.workload.context import BlockingContext

    channel = Recorder()
    ctx = BlockingContext(Context(channel, "run-1", {"a": 1}))
    assert ctx.step("a", lambda: 99) == 1  # served
    assert ctx.step("b", lambda x: x + 1, 41) == 42
    assert ctx.run_id == "run-1"
    assert channel.steps() == [("enter", "b"), ("output", "b")]


def test_a_completed_step_asked_for_at_another_position_is_not_served() -> None:
    """The journal holds a then b; changed code asks for b first: the harness reports it with
    its position (the control plane then fails the run with nondeterminism)."""
    channel = Recorder()
    ctx = Context(channel, "run-1", {"a": 1, "b": 2}, order=["a", "b"])

    async def work() -> Any:
        return await ctx.step("b", lambda: 20)

    asyncio.run(work())
    (op, started) = channel.asked[0]
    assert (op, started["stepId"], started["position"]) == ("step", "b", 1)


def test_ctx_model_asks_the_control_plane_and_a_replay_is_served() -> None:
    from lantern.workload import ModelReply

    class Answering(Recorder):
        def ask(self, op: str, **fields: Any) -> Any:
            super().ask(op, **fields)
            return {"output": {"text": "hi", "model": "m", "usage": {"inputTokens": 3}}}

    channel = Answering()
    ctx = Context(channel, "run-1", {"model": {"text": "old"}}, order=["model"])

    async def work() -> tuple[ModelReply, ModelReply]:
        first = await ctx.model("m", prompt="Say hi")  # step "model": served from the journal
        second = await ctx.model("m", prompt="Again")  # model#2: the control plane performs it
        return first, second

    first, second = asyncio.run(work())
    assert first.text == "old" and (second.text, second.usage["inputTokens"]) == ("hi", 3)
    [(op, fields)] = channel.asked
    assert (op, fields["stepId"], fields["position"]) == ("call", "model#2", 2)
    assert fields["call"]["kind"] == "model" and fields["call"]["prompt"] == "Again"


def test_a_workload_gets_the_reply_and_decision_types_an_in_process_agent_gets() -> None:
    import lantern
    import lantern.workload

    # One definition for both sides: a workload can check isinstance(reply, lantern.ModelReply).
    assert lantern.workload.ModelReply is lantern.ModelReply
    assert lantern.workload.Approval is lantern.Approval
    reply = lantern.ModelReply.from_json({"text": "hi", "toolCalls": [{"id": "1", "name": "t"}]})
    assert (reply.text, reply.tool_calls) == ("hi", ({"id": "1", "name": "t"},))
    assert not lantern.Approval.from_json({}).approved  # no decision journaled: rejected


def test_a_refused_call_raises_call_refused_and_takes_no_position() -> None:
    from lantern.workload import CallRefused
    from lantern.workload.channel import ChannelError

    class Refusing(Recorder):
        def ask(self, op: str, **fields: Any) -> Any:
            if op == "call":
                raise ChannelError("ctx.tool('nope'): no such tool is registered", 422)
            return super().ask(op, **fields)

    async def work(ctx: Context) -> str:
        try:
            await ctx.tool("nope")
        except CallRefused as exc:
            refused = str(exc)
        await ctx.step("a", lambda: 1)
        return refused

    channel = Refusing()
    assert asyncio.run(work(Context(channel, "run-1"))) == (
        "ctx.tool('nope'): no such tool is registered"
    )
    # Nothing was journaled for the refused call, so the next step is the first, as in-process.
    (op, started) = channel.asked[0]
    assert (op, started["stepId"], started["position"]) == ("step", "a", 1)
