"""The runtime node's end of a VM's channel (the wire is :mod:`lantern.workload.channel`)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from lantern.runtime.drivers.base import Vm


class Refused(Exception):
    """The answer to a VM's request is no; ``status`` is the control plane's, when it spoke."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


Handler = Callable[[str, dict[str, Any]], Awaitable[Any]]


async def serve(vm: Vm, handle: Handler, first: Awaitable[bytes] | None = None) -> None:
    """Answer the VM's requests one at a time until it closes its end (it exited).
    ``first``: its first line, already being read (a warm VM's question for its job)."""
    while True:
        try:
            if first is not None:
                line, first = await first, None
            else:
                line = await vm.reader.readline()
        except (ValueError, ConnectionError):  # a line past the limit, or the VM is gone
            return
        if not line:
            return
        try:
            request = json.loads(line)
            op = str(request["op"])
        except (ValueError, KeyError, TypeError):
            return  # a VM that speaks garbage gets no more answers
        answer: dict[str, Any] = {"id": request.get("id")}
        try:
            answer |= {"ok": True, "result": await handle(op, request)}
        except Refused as exc:
            answer |= {"ok": False, "error": str(exc), "status": exc.status}
        except Exception as exc:  # the control plane is away, say: the VM hears of it
            answer |= {"ok": False, "error": f"{type(exc).__name__}: {exc}", "status": 503}
        try:
            vm.writer.write(json.dumps(answer, separators=(",", ":")).encode() + b"\n")
            await vm.writer.drain()
        except (ConnectionError, RuntimeError):
            return
