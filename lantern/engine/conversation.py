"""Drives a plain LLM agent: model turn, tool calls, model turn, ... each a journaled step.

What runs next is ``turns.next_action``, a pure function of the completed steps; the journal
discipline is ``Drive``'s, as for every kind of run: a step's ``step_started`` is committed
before it is invoked; its ``step_completed`` is committed with the next step's ``step_started``
(or the run's end) in one transaction; a re-drive folds the journal, serves every completed
turn and tool call from it (the provider is never contacted for them), re-runs the one step in
flight with the attempt it started with (so the same Idempotency-Key), and goes on. Steps run
one at a time; each model turn and tool call gets a span (``llm``/``tool``), counts and, with
``timeoutMs``, a time limit (a model turn past it fails and may be retried; a tool call past
it answers the model with an error).
"""

from __future__ import annotations

import asyncio
from typing import Any

from lantern.app import ToolContext
from lantern.engine import turns
from lantern.engine.anomalies import signature
from lantern.engine.drive import Drive, DriveHost, attempts, parked_until
from lantern.engine.graph import PlainAgent
from lantern.engine.journal import RunState
from lantern.engine.ledger import Attempt, Due, Exit, Failed, Retry, encoded, no_usage
from lantern.engine.live import OnText
from lantern.engine.retries import RetryPolicy
from lantern.engine.spend import gate
from lantern.errors import LanternError, StepError, ToolUnavailable
from lantern.models import tools
from lantern.models.call import call, journal_usage
from lantern.models.records import ModelRequest, tool_calls_json
from lantern.observability import logs
from lantern.store.records import NewEvent, Run, RunUpdate

# The action, its attempt, and (a retry waiting out its backoff) when that attempt is due,
# in epoch ms: it is journaled as started only then.
Step = tuple[turns.CallModel | turns.CallTool, int, int | None]


class Conversation(Drive):
    """One drive of one plain agent's run: ``turns.next_action`` decides, ``Drive`` journals."""

    def __init__(self, host: DriveHost, run: Run, agent: PlainAgent) -> None:
        # A plain agent has no graph to pause at: a "pause" policy is recorded, not applied.
        super().__init__(host, run, anomalies=agent.anomalies, can_pause=False, budget=agent.budget)
        self.agent = agent
        self.policy = RetryPolicy.of({"retry": agent.retry}, "model")
        # The agent's limit, else the server's (LANTERN_STEP_TIMEOUT).
        self.timeout = host.step_timeout if agent.timeout_ms is None else agent.timeout_ms / 1000
        self._step: Step | None = None

    def step_type(self, step: str) -> str:
        return "llm" if step.startswith("llm:") else "tool"

    def plan(self, state: RunState) -> tuple[list[NewEvent], RunUpdate | None]:
        events, end, self._step = self._next()
        return events, end

    async def proceed(self) -> None:
        step = self._step
        while step is not None and self.final is None:
            step = await self._perform(*step)

    def _next(self) -> tuple[list[NewEvent], RunUpdate | None, Step | None]:
        """What follows the steps completed so far: the next step started, or the run's end."""
        action = turns.next_action(self.agent, self.outputs)
        if isinstance(action, turns.Finish):
            event, update = self.succeeded(action.output)
            return [event], update, None
        if isinstance(action, turns.GiveUp):
            event, update = self.run_failed(action.error)
            return [event], update, None
        entry = self.ledger.enter(action.step)
        if isinstance(entry, Due):  # a backoff the crash cut short
            return [], None, (action, entry.attempt, entry.due_ms)
        if isinstance(entry, Attempt) and not entry.start:  # in flight at a crash: same key
            return [], None, (action, entry.attempt, None)
        return [self.start(action.step, 1, _start_data(action))], None, (action, 1, None)

    def _interruptible(self, action: turns.CallModel | turns.CallTool) -> bool:
        if isinstance(action, turns.CallModel) or action.tool is None:
            return True
        tool = self.host.app.tools_for(self.run.workspace).registered(action.tool)
        return tool is None or tool.interruptible

    async def _perform(
        self, action: turns.CallModel | turns.CallTool, attempt: int, due: int | None
    ) -> Step | None:
        """One step (a model turn, a tool call), its retries included, then what follows it
        journaled with the next step's start; None once the drive stops."""
        turn = _Turn(self, action)
        try:
            done = await attempts(turn, attempt, due, False)  # its first start went with _next
        except _Stopped:
            return None
        if done is None:
            return None
        if isinstance(done.next, Failed):
            ended, update = self.step_ended_run(action.step, done.next.error)
            await self.commit([*done.events, ended], update)
            return None
        waited = turn.waited
        events = done.events
        self.ensure_live()
        if self.cancelled.is_set():
            await self.cancel(events, (), waited)  # with what did complete
            return None
        if self.host.stopping.is_set():  # a clean stop: journal what finished, start nothing
            await self.commit(events)
            return None
        failed, _ = await self.anomalies(events, self._starting())
        if failed is not None:
            await self.commit(events, failed)
            return None
        more, end, step = self._next()
        await self.commit(events + more, end)
        return step

    def _starting(self) -> list[str]:
        """The signature of the step about to start, for the runaway-loop check."""
        action = turns.next_action(self.agent, self.outputs)
        if (
            isinstance(action, turns.CallModel | turns.CallTool)
            and action.step not in self.attempts
        ):
            return [signature(action.step, _start_data(action))]
        return []

    async def _invoke(self, action: turns.CallModel | turns.CallTool, attempt: int) -> Any:
        key = self.key(action.step, attempt)
        if isinstance(action, turns.CallModel):
            live = self.host.live
            try:
                return await self._model_turn(key, live.sink(self.run.id, action.step, attempt))
            finally:
                live.finished(self.run.id, action.step, attempt)
        return await self._tool_call(action, attempt, key)

    async def _model_turn(self, key: str, on_text: OnText | None) -> dict[str, Any]:
        specs = []
        # "server.*" names every tool of an MCP server, as the server lists them now.
        box = self.host.app.tools_for(self.run.workspace)
        names = tools.wire_names(await box.resolve(self.agent.tools))
        for wire, name in names.items():
            tool = await box.find(name)
            if tool is None:
                raise StepError(
                    f"tool {name!r} is not registered in this process"
                    " (load it with --app MODULE:OBJECT)",
                    error_class="tool",
                )
            specs.append(tools.spec(tool, wire))
        request = ModelRequest(
            model=self.agent.model,
            messages=tuple(turns.transcript(self.agent, self.run.input, self.outputs)),
            idempotency_key=key,
            system=self.agent.system,
            temperature=self.agent.temperature,
            max_tokens=self.agent.max_tokens,
            tools=tuple(specs),
        )
        result = await call(
            self.host.models,
            request,
            gate(self.host.store, self.run, self.ledger, self.host.models),
            on_text=on_text,
        )
        output = result.output()
        output["toolCalls"] = tool_calls_json(result.response.tool_calls)
        for call_json in output["toolCalls"]:
            # Which tool each call names is journaled with it: a re-drive maps it back the
            # same way even if an MCP server's tool list changed meanwhile.
            call_json["tool"] = names.get(call_json["name"], "")
        return output

    async def _tool_call(self, action: turns.CallTool, attempt: int, key: str) -> Any:
        """The tool's answer; a failure goes back to the model as ``{"error": ...}``, but a
        tool that cannot be reached (ToolUnavailable) fails the step."""
        box = self.host.app.tools_for(self.run.workspace)
        tool = await box.find(action.tool) if action.tool else None
        if tool is None:
            return {"error": f"there is no tool {action.call.name!r}"}
        deliveries = self.deliveries(action.step, attempt)
        context = ToolContext(
            self.run.id, action.step, attempt, key, deliveries.once, self.run.workspace
        )
        try:
            args = tools.validated(tool, dict(action.call.arguments))
            result = await asyncio.wait_for(tool.call(context, args), self.timeout)
        except TimeoutError:
            assert self.timeout is not None
            return {
                "error": f"tool {action.tool!r} timed out after {round(self.timeout * 1000)} ms"
            }
        except ValueError as exc:
            return {"error": f"invalid arguments for {action.tool!r}: {exc}"}
        except LanternError as exc:
            if not isinstance(exc, StepError) or isinstance(exc, ToolUnavailable):
                # A lost lease, a store failure, a tool's MCP server that is down: not the
                # model's business; the step fails (a down server's retryably).
                raise
            return {"error": str(exc)}
        except Exception as exc:
            logs.tool_raised(action.tool or "?", self.run.id, action.step, exc)
            return {"error": f"{type(exc).__name__}: {exc}"}
        problem = encoded(result, self.ledger.max_output)
        if isinstance(problem, str):
            unstorable = "returned a value the journal cannot store"
            return {"error": f"tool {action.tool!r} {unstorable}: {problem}"}
        return result


class _Stopped(Exception):
    """The drive stopped (cancelled) while a step attempt ran."""


class _Turn:
    """How a plain agent's step journals its attempts (``drive.attempts``): a retry's
    ``step_retrying`` and start are committed on their own; a rate limit's wait that parks
    goes with the park; the last attempt's outcome goes with what follows it
    (``Conversation._perform``)."""

    __slots__ = ("action", "c", "parking", "waited")

    def __init__(self, c: Conversation, action: turns.CallModel | turns.CallTool) -> None:
        self.c, self.action = c, action
        self.waited: list[str] = []  # a sync tool the cancellation had to wait for
        self.parking: list[NewEvent] | None = None  # a step_throttled to commit with the park

    async def backoff(self, due_ms: int) -> bool:
        c = self.c
        if self.parking is not None or c.ledger.parks(self.action.step, due_ms):
            # A rate limit's wait holds no slot and no lease: the run parks until it is due
            # and whichever replica claims it then makes the call.
            events, self.parking = self.parking or [], None
            await c.commit(events, parked_until(due_ms))
            return False
        if c.host.stopping.is_set():
            return False  # a clean stop: the retry is journaled, whoever drives next runs it
        if await c.backoff(due_ms):
            return True
        await c.cancel([])
        return False

    async def ready(self, attempt: int, start: bool) -> None:
        if start:
            action = self.action
            await self.c.commit([self.c.start(action.step, attempt, _start_data(action))])

    async def attempt(self, attempt: int) -> Any:
        c, action = self.c, self.action
        model = isinstance(action, turns.CallModel)
        work = c._invoke(action, attempt)
        task = c.perform(action.step, attempt, work, c.timeout if model else None)
        cancel = asyncio.ensure_future(c.cancelled.wait())
        try:
            await asyncio.wait([task, cancel], return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancel.cancel()
        if not task.done():
            if c._interruptible(action):
                await c.cancel([], [task])
                raise _Stopped
            # A sync tool runs in a thread, which cannot be interrupted: its return is the
            # next step boundary, where the run stops with what the tool did journaled.
            self.waited = [action.step]
            c.waits_for_thread(self.waited)
            await asyncio.wait([task])
        exc = task.exception()
        if exc is not None and not isinstance(exc, StepError):
            raise exc
        return exc if exc is not None else task.result()

    async def settled(self, attempt: int, outcome: Any) -> Exit:
        c, action = self.c, self.action
        model = isinstance(action, turns.CallModel)
        # A tool call's failure goes back to the model; only a model turn, or a tool call
        # whose server was down, is retried (under the agent's policy).
        retried = model or isinstance(outcome, ToolUnavailable)
        policy = c.policy if retried else _NEVER
        done = c.settle(action.step, attempt, outcome, policy, journal_usage if model else no_usage)
        if isinstance(done.next, Retry):
            if c.ledger.parks(action.step, done.next.due_ms):
                self.parking = done.events  # one commit with the park (``backoff``)
            else:
                await c.commit(done.events)  # its due time survives a crash
        return done


def _start_data(action: turns.CallModel | turns.CallTool) -> dict[str, Any]:
    """A tool call's start names the call, so a loop of the same call shows (runaway_loop)."""
    if isinstance(action, turns.CallModel):
        return {"type": "llm"}
    return {"type": "tool", "call": {"tool": action.tool, "args": dict(action.call.arguments)}}


# A tool call's failure goes back to the model; only a model turn is retried.
_NEVER = RetryPolicy.of({})
