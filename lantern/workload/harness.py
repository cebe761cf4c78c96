"""The harness: the first and only program a VM runs.

It asks its runtime node for the run (``hello``), reads the completed steps when
``LANTERN_RESUME=1`` (the node fetches them from ``GET /v1/runtime/steps``), imports the
entrypoint ``MODULE:FUNCTION`` from the app directory, calls it with a Context and the run's
input, and tells the node how the workload ended: ``done`` with the output, or ``failed``
with the error. An entrypoint that does not import is a failure of the run, not a loss of the
VM, so the run is not resumed for it.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from lantern.workload.channel import Channel, ChannelError
from lantern.workload.context import BlockingContext, Context, StepFailed, _set_resumed
from lantern.workload.entrypoints import allowed

EXIT_OK = 0
EXIT_FAILED = 1  # the workload raised: the run failed
EXIT_LOST = 3  # the channel went away: the node decides what that means


class NotRegistered(Exception):
    """The entrypoint imported, but the app did not register it (for this workspace)."""


def load(entrypoint: str, workspace: str | None = None) -> Callable[..., Any]:
    """The function ``MODULE:FUNCTION`` names (a code-first agent's decorator may wrap it),
    if the app registered it for ``workspace`` (lantern.workload.entrypoints)."""
    module_name, sep, attr = entrypoint.partition(":")
    if not sep or not module_name or not attr:
        raise ImportError(f"entrypoint {entrypoint!r} is not MODULE:FUNCTION")
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ImportError(f"module {module_name!r} has no {attr!r}")
    fn = obj if inspect.isfunction(obj) else getattr(obj, "fn", obj)
    if not callable(fn):
        raise ImportError(f"entrypoint {entrypoint!r} is not callable")
    if not (allowed(obj, workspace) or allowed(fn, workspace)):
        raise NotRegistered(
            f"entrypoint {entrypoint!r} is not a function the app registers for this workspace:"
            " register it with @app.agent or app.entrypoint(fn)"
        )
    return fn


def run(channel: Channel) -> int:
    # A warm VM booted before its run was placed: its job, and the variables that go with it
    # (LANTERN_RESUME, LANTERN_VM_ID), come in the answer; a VM booted for its run has them
    # in its environment already, the same.
    hello = channel.ask("hello")
    env = hello.get("env") or {}
    os.environ.update({str(k): str(v) for k, v in env.items()})
    resume = os.environ.get("LANTERN_RESUME") == "1"
    _set_resumed(resume)
    completed: dict[str, Any] = {}
    order: list[str] = []
    if resume:
        journal = channel.ask("steps")
        for step in journal["steps"]:
            completed[step["stepId"]] = step["output"]
        order = list(journal.get("order") or ())
    try:
        fn = load(hello["entrypoint"], hello.get("workspace"))
    except NotRegistered as exc:
        error = {
            "code": "entrypoint_not_registered",
            "message": str(exc),
            "class": "tool",
            "retryable": False,
        }
        channel.ask("failed", error=error)
        return EXIT_FAILED
    except Exception as exc:  # ImportError, SyntaxError, or what the module raised
        error = {
            "code": "entrypoint_import",
            "message": f"cannot import entrypoint {hello['entrypoint']!r}: "
            f"{type(exc).__name__}: {exc}",
            "class": "tool",
            "retryable": False,
        }
        channel.ask("failed", error=error)
        return EXIT_FAILED
    ctx = Context(channel, hello["runId"], completed, order)
    given = hello.get("input")
    kwargs = given if isinstance(given, dict) else {"input": given}
    # A plain ``def`` gets the same methods, blocking, as a code-first agent's does.
    handed: Any = ctx if inspect.iscoroutinefunction(fn) else BlockingContext(ctx)
    try:
        result = fn(handed, **kwargs)
        if inspect.isawaitable(result):
            result = asyncio.run(_awaited(result))
        output = json.loads(json.dumps(result))
    except ChannelError:
        raise
    except (Exception, SystemExit) as exc:  # the workload's own end: reported, never a loss
        channel.ask("failed", error=_workload_error(exc))
        return EXIT_FAILED
    # How many calls it made: a resumed workload that returns before asking for every step the
    # journal holds was changed (the control plane fails the run with nondeterminism).
    channel.ask("done", output=output, calls=ctx.calls)
    return EXIT_OK


async def _awaited(result: Any) -> Any:
    return await result


def _workload_error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, StepFailed):  # a step failed for good and the workload let it end it
        return {"code": "step_failed", "step": exc.step_id, **exc.error}
    detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return {"code": "workload_failed", "message": detail, "class": "tool", "retryable": False}


def main() -> int:
    spec = os.environ.get("LANTERN_CHANNEL", "stdio")
    sys.path.insert(0, os.environ.get("LANTERN_APP_DIR", "/app"))
    try:
        channel = Channel.open(spec)
        return run(channel)
    except ChannelError as exc:
        print(f"lantern harness: {exc}", file=sys.stderr)
        return EXIT_LOST
