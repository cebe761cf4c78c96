"""Drives a plain LLM agent: model turn, tool calls, model turn, ... each a journaled step.

The journal discipline is the graph runner's: a step's ``step_started`` is committed before
it is invoked; its ``step_completed`` is committed with the next step's ``step_started`` (or
the run's end) in one transaction; a re-drive folds the journal, serves every completed turn
and tool call from it (the provider is never contacted for them), re-runs the one step in
flight with the attempt it started with (so the same Idempotency-Key), and goes on. Steps run
one at a time, so the conversation is a pure function of the completed steps (``turns``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import TYPE_CHECKING, Any

from lantern.app import ToolContext
from lantern.effects.claims import Deliveries
from lantern.engine import events as ev
from lantern.engine import turns
from lantern.engine.anomalies import Detector, signature
from lantern.engine.graph import PlainAgent
from lantern.engine.journal import EventWriter, RunState, fold, recovery
from lantern.engine.live import OnText
from lantern.engine.retries import RetryPolicy
from lantern.engine.spend import gate
from lantern.errors import LanternError, LeaseLost, StepError
from lantern.ids import idempotency_key
from lantern.models import registry, tools
from lantern.models.budget import spent_in
from lantern.models.call import call, journal_usage
from lantern.models.records import ModelRequest, tool_calls_json
from lantern.observability import logs, metrics
from lantern.store.codec import dumps, text_problem
from lantern.store.records import TERMINAL, Append, Lease, NewEvent, Run, RunUpdate, RunUsage

if TYPE_CHECKING:
    from lantern.engine.runner import Runner

# The action, its attempt, and (a retry waiting out its backoff) when that attempt is due,
# in epoch ms: it is journaled as started only then.
Step = tuple[turns.CallModel | turns.CallTool, int, int | None]


class Conversation:
    """One drive of one plain agent's run (the runner's counterpart of a graph drive)."""

    def __init__(self, runner: Runner, run: Run, agent: PlainAgent) -> None:
        self.r = runner
        self.run = run
        self.agent = agent
        self.lease = Lease(run.id, runner.worker_id, 0)
        self.writer = EventWriter(run.id)
        self.outputs: dict[str, Any] = {}
        self.attempts: dict[str, int] = {}
        self.retrying: dict[str, tuple[int, int]] = {}  # step -> (next attempt, due ms)
        self.policy = RetryPolicy.of({"retry": agent.retry}, "model")
        self.final: RunUpdate | None = None
        self.cancelled = asyncio.Event()
        self.models = registry.default()
        self._begun: Step | None = None
        self._opened = False
        # A plain agent has no graph to pause at: a "pause" policy is recorded, not applied.
        self.detector = Detector(
            run.workspace,
            {
                k: {**v, "policy": "fail" if v["policy"] == "fail" else "record"}
                for k, v in agent.anomalies.items()
            },
            runner.retry_rates,
            functools.partial(runner.baseline, run.workspace, run.agent_name),
        )
        if run.cancel_requested:
            self.cancelled.set()

    async def begin(self) -> Lease | None:
        """Lease a never-started run and journal its opening, in one transaction."""
        events, update, step = self._plan(RunState())
        lease = await self.r.store.start_run(
            self.run.id, self.r.worker_id, self.r.keeper.ttl, events, update or RunUpdate("running")
        )
        if lease is not None:
            self._committed(events, update)
            self._begun, self._opened = step, True
        return lease

    async def execute(self, lease: Lease, state: RunState | None) -> None:
        self.lease = lease
        step = self._begun
        if not self._opened:
            if state is None:
                journal = await self.r.store.events(self.run.id, blobs=True)
                state = fold(journal)
                self.detector.replay(journal)
            if state.terminal is not None:
                return
            if self.cancelled.is_set():
                self.writer = EventWriter(self.run.id, state.last_seq, state.last_hash)
                await self._cancel([])
                return
            events, update, step = self._plan(state)
            await self._commit(events, update)
        while step is not None and self.final is None:
            step = await self._perform(*step)

    def _plan(self, state: RunState) -> tuple[list[NewEvent], RunUpdate | None, Step | None]:
        """The opening commit of this drive, and the step to run once it is durable."""
        self.writer = w = EventWriter(self.run.id, state.last_seq, state.last_hash)
        self.outputs = dict(state.outputs)
        self.attempts = dict(state.attempts)
        self.retrying = dict(state.retrying)
        if not state.started:
            events = [w.event(ev.RUN_STARTED, {"worker": self.r.worker_id})]
            update: RunUpdate | None = RunUpdate("running")
        else:
            metrics.RECOVERIES.inc()
            event, failed = recovery(
                w, state, self.r.worker_id, self.lease.epoch, self.r.max_recoveries
            )
            if failed is not None:
                return [event], failed, None
            events, update = [event], None
        more, end, step = self._next()
        return events + more, end or update, step

    def _next(self) -> tuple[list[NewEvent], RunUpdate | None, Step | None]:
        """What follows the steps completed so far: the next step started, or the run's end."""
        action = turns.next_action(self.agent, self.outputs)
        w = self.writer
        if isinstance(action, turns.Finish):
            return (
                [w.event(ev.RUN_SUCCEEDED, {"output": action.output})],
                RunUpdate("succeeded", output=action.output),
                None,
            )
        if isinstance(action, turns.GiveUp):
            return (
                [w.event(ev.RUN_FAILED, {"error": action.error})],
                RunUpdate("failed", error=action.error),
                None,
            )
        retry = self.retrying.get(action.step)
        if retry is not None and retry[0] > self.attempts.get(action.step, 0):
            return [], None, (action, *retry)  # a backoff the crash cut short
        if action.step in self.attempts:  # in flight at a crash: same attempt, same key
            return [], None, (action, self.attempts[action.step], None)
        return [self._started(action, 1)], None, (action, 1, None)

    def _started(self, action: turns.CallModel | turns.CallTool, attempt: int) -> NewEvent:
        self.attempts[action.step] = attempt
        return self.writer.event(
            ev.STEP_STARTED, _start_data(action), step_id=action.step, attempt=attempt
        )

    async def _perform(
        self, action: turns.CallModel | turns.CallTool, attempt: int, due: int | None
    ) -> Step | None:
        if due is not None:  # a retry: wait out its backoff, then journal its start
            try:
                delay = max(0.0, due / 1000 - time.time())
                await asyncio.wait_for(self.cancelled.wait(), delay)
            except TimeoutError:
                pass
            if self.cancelled.is_set():
                await self._cancel([])
                return None
            await self._commit([self._started(action, attempt)], None)
        task = asyncio.ensure_future(self._invoke(action, attempt))
        cancel = asyncio.ensure_future(self.cancelled.wait())
        try:
            await asyncio.wait([task, cancel], return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancel.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await self._cancel([])
            return None
        exc = task.exception()
        if exc is not None and not isinstance(exc, StepError):
            raise exc
        events: list[NewEvent]
        if exc is not None:
            assert isinstance(exc, StepError)
            if isinstance(action, turns.CallModel) and self.policy.retries(exc, attempt):
                return await self._retry(action, attempt, exc)
            error = ev.step_failed_error(action.step, exc.to_json())
            events = [
                self.writer.event(
                    ev.STEP_FAILED, {"error": exc.to_json()}, step_id=action.step, attempt=attempt
                ),
                self.writer.event(ev.RUN_FAILED, {"error": error}),
            ]
            await self._commit(events, RunUpdate("failed", error=error))
            return None
        output = task.result()
        usage = journal_usage(output) if isinstance(action, turns.CallModel) else None
        events = [self.writer.completed(action.step, attempt, output, usage=usage)]
        self.outputs[action.step] = output
        if not self.r.keeper.live(self.run.id):
            raise LeaseLost(self.run.id, self.lease.epoch)
        if self.cancelled.is_set():
            await self._cancel(events)  # with what did complete
            return None
        if self.r.stopping.is_set():  # a clean stop: journal what finished, start nothing
            await self._commit(events, None)
            return None
        failed = await self._anomalies(events)
        if failed is not None:
            await self._commit(events, failed)
            return None
        more, end, step = self._next()
        await self._commit(events + more, end)
        return step

    async def _anomalies(self, events: list[NewEvent]) -> RunUpdate | None:
        """Journal the anomalies these events and the next step raise (into ``events``);
        the run's failure when one's policy is ``fail``."""
        action = turns.next_action(self.agent, self.outputs)
        starting = []
        if (
            isinstance(action, turns.CallModel | turns.CallTool)
            and action.step not in self.attempts
        ):
            starting = [signature(action.step, _start_data(action))]
        update = None
        for a in await self.detector.check(events, starting):
            data = {"kind": a.kind, "detail": a.detail, "policy": a.policy}
            events.append(self.writer.event(ev.ANOMALY_DETECTED, data))
            if a.policy == "fail" and update is None:
                error = ev.anomaly_error(a.kind, a.detail)
                events.append(self.writer.event(ev.RUN_FAILED, {"error": error}))
                update = RunUpdate("failed", error=error)
        return update

    async def _retry(self, action: turns.CallModel, attempt: int, exc: StepError) -> Step | None:
        """Journal the next attempt and when it is due (so the backoff survives a crash)."""
        delay = self.policy.delay_ms(attempt)
        due = int(time.time() * 1000) + delay
        data = {
            "attempt": attempt + 1,
            "of": self.policy.max_attempts,
            "error": exc.to_json(),
            "delayMs": delay,
            "dueAt": due,
        }
        event = self.writer.event(ev.STEP_RETRYING, data, step_id=action.step, attempt=attempt + 1)
        self.retrying[action.step] = (attempt + 1, due)
        await self._commit([event], None)
        if self.r.stopping.is_set():
            return None
        return action, attempt + 1, due

    async def _invoke(self, action: turns.CallModel | turns.CallTool, attempt: int) -> Any:
        key = idempotency_key(self.run.id, action.step, attempt)
        if isinstance(action, turns.CallModel):
            live = self.r.live
            try:
                return await self._model_turn(key, live.sink(self.run.id, action.step, attempt))
            finally:
                live.finished(self.run.id, action.step, attempt)
        return await self._tool_call(action, attempt, key)

    async def _model_turn(self, key: str, on_text: OnText | None) -> dict[str, Any]:
        specs = []
        for wire, name in tools.wire_names(self.agent.tools).items():
            tool = self.r.app.tools.get(name)
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
            self.models,
            request,
            gate(self.r.store, self.run, self.agent.budget, self._spent),
            on_text=on_text,
        )
        output = result.output()
        output["toolCalls"] = tool_calls_json(result.response.tool_calls)
        return output

    def _spent(self) -> RunUsage:
        return spent_in(
            out.get("usage")
            for step, out in self.outputs.items()
            if step.startswith("llm:") and isinstance(out, dict)
        )

    async def _tool_call(self, action: turns.CallTool, attempt: int, key: str) -> Any:
        """The tool's answer; a failure goes back to the model as ``{"error": ...}``."""
        tool = self.r.app.tools.get(action.tool) if action.tool else None
        if tool is None:
            return {"error": f"there is no tool {action.call.name!r}"}
        deliveries = Deliveries(
            self.r.store, self.lease, step_id=action.step, attempt=attempt, idempotency_key=key
        )
        context = ToolContext(self.run.id, action.step, attempt, key, deliveries.once)
        try:
            args = tools.validated(tool, dict(action.call.arguments))
            result = await tool.call(context, args)
        except ValueError as exc:
            return {"error": f"invalid arguments for {action.tool!r}: {exc}"}
        except LanternError as exc:
            if not isinstance(exc, StepError):
                raise  # a lost lease, a store failure: not the model's business
            return {"error": str(exc)}
        except Exception as exc:
            logs.tool_raised(action.tool or "?", self.run.id, action.step, exc)
            return {"error": f"{type(exc).__name__}: {exc}"}
        try:
            problem = text_problem(dumps(result))
        except (TypeError, ValueError) as exc:
            problem = f"it is not JSON: {exc}"
        if problem is not None:
            problem = f"tool {action.tool!r} returned a value the journal cannot store: {problem}"
            return {"error": problem}
        return result

    async def _cancel(self, events: list[NewEvent]) -> None:
        events.append(self.writer.event(ev.RUN_CANCELLED, {"by": "request"}))
        await self._commit(events, RunUpdate("cancelled", error=ev.CANCELLED))

    async def _commit(self, events: list[NewEvent], update: RunUpdate | None) -> None:
        await self.r.store.append(Append(self.lease, tuple(events), update))
        self._committed(events, update)

    def _committed(self, events: list[NewEvent], update: RunUpdate | None) -> None:
        self.detector.replay(events)
        if update is not None and update.status in TERMINAL:
            self.final = update
        run = self.run
        logs.run_events(run.id, run.agent_name, run.agent_version, self.r.worker_id, events)
        for listener in self.r.app.commit_listeners:
            listener(self.run.id, events)


def _start_data(action: turns.CallModel | turns.CallTool) -> dict[str, Any]:
    """A tool call's start names the call, so a loop of the same call shows (runaway_loop)."""
    if isinstance(action, turns.CallModel):
        return {"type": "llm"}
    return {"type": "tool", "call": {"tool": action.tool, "args": dict(action.call.arguments)}}
