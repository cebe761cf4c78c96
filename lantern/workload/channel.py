"""The wire between a VM's harness and its runtime node: one JSON object per line.

The harness asks (``{"id": N, "op": ..., ...}``) and waits for the answer with the same id
(``{"id": N, "ok": true, "result": ...}`` or ``{"id": N, "ok": false, "error": "...",
"status": 409}``). One question at a time, so the node relays reports in the order the
workload made them. The channel is the VM's only way out: stdio under ``sandbox`` and
``gvisor``, a virtio-serial port under ``qemu``.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, BinaryIO

MAX_LINE = 16 * 1024 * 1024  # a report larger than this is refused by the node as well


class ChannelError(Exception):
    """The node refused a request (``status`` as the control plane gave it) or went away."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Channel:
    def __init__(self, reader: BinaryIO, writer: BinaryIO) -> None:
        self._reader = reader
        self._writer = writer
        self._next = 0
        self._lock = threading.Lock()  # steps may run in threads; questions stay one at a time

    @classmethod
    def open(cls, spec: str) -> Channel:
        """``stdio``: the node's pipes (the workload's own prints then go to stderr);
        anything else is a character device such as ``/dev/hvc1``."""
        if spec == "stdio":
            out = os.dup(1)
            os.dup2(2, 1)  # print() in the workload must not corrupt the channel
            return cls(open(0, "rb"), open(out, "wb", buffering=0))
        fd = os.open(spec, os.O_RDWR | os.O_NOCTTY)
        return cls(open(fd, "rb", closefd=False), open(fd, "wb", buffering=0))

    def ask(self, op: str, **fields: Any) -> Any:
        with self._lock:
            self._next += 1
            request = {"id": self._next, "op": op, **fields}
            self._writer.write(json.dumps(request, separators=(",", ":")).encode() + b"\n")
            self._writer.flush()
            line = _readline(self._reader)
        if not line:
            raise ChannelError("the runtime node closed the channel")
        answer = json.loads(line)
        if answer.get("id") != request["id"]:
            raise ChannelError(f"answer {answer.get('id')} to question {request['id']}")
        if not answer.get("ok"):
            raise ChannelError(str(answer.get("error")), int(answer.get("status") or 0))
        return answer.get("result")


def _readline(reader: BinaryIO) -> bytes:
    line = reader.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise ChannelError("answer too large")
    return line
