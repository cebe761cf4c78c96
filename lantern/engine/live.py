"""Live text: what a model step has generated so far, for whoever follows the run.

Never journaled (the journal keeps the step's final text, in its ``step_completed``) and kept
in this process only, so only the replica driving a run has its live text. A provider
streaming an answer appends each piece to the step attempt's buffer; a follower remembers how
much of each buffer it has passed on and, when woken, takes the rest as one ``Delta`` with the
offset it starts at. A slow follower so gets bigger pieces, never a backlog, and a follower
that joins mid-step gets the text so far in one piece.

A delta's ``offset`` is where its text goes in the attempt's text, so a client applying
``text = text[:offset] + delta.text`` shows no text twice: neither when it reconnects and is
sent a buffer again from 0, nor when a recovered run re-runs the step on another replica and
its text starts over. A new attempt of a step (a retry) starts a new buffer, which replaces
the failed attempt's text.

A model call streams only when someone follows its run on this replica as it starts; a
follower that arrives later sees that step's text when it completes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

KEEP_S = 30.0  # how long a finished attempt's text stays for followers still catching up

Wake = Callable[[], None]
OnText = Callable[[str], None]


@dataclass(frozen=True)
class Delta:
    step_id: str
    attempt: int
    text: str
    offset: int

    def to_json(self) -> dict[str, object]:
        return {
            "stepId": self.step_id,
            "attempt": self.attempt,
            "text": self.text,
            "offset": self.offset,
        }


class _Text:
    __slots__ = ("_joined", "attempt", "parts", "size")

    def __init__(self, attempt: int) -> None:
        self.attempt = attempt
        self.parts: list[str] = []
        self.size = 0
        self._joined: str | None = ""

    def add(self, text: str) -> None:
        self.parts.append(text)
        self.size += len(text)
        self._joined = None

    def since(self, offset: int) -> str:
        if self._joined is None:
            self._joined = "".join(self.parts)
            self.parts = [self._joined]
        return self._joined[offset:]


class LiveText:
    """The live text of the model steps this process is running, by run and step."""

    def __init__(self) -> None:
        self._texts: dict[str, dict[str, _Text]] = {}
        self._wakes: dict[str, set[Wake]] = {}

    def listening(self, run_id: str) -> bool:
        return bool(self._wakes.get(run_id))

    def sink(self, run_id: str, step_id: str, attempt: int) -> OnText | None:
        """Where a provider sends the pieces of this step attempt's answer; None while nobody
        follows the run here, so the call is not streamed (streaming costs CPU: parsing
        hundreds of chunks instead of one body; see bench/streaming.py)."""
        if not self.listening(run_id):
            return None

        def on_text(text: str) -> None:
            self.append(run_id, step_id, attempt, text)

        return on_text

    def append(self, run_id: str, step_id: str, attempt: int, text: str) -> None:
        if not text:
            return
        steps = self._texts.setdefault(run_id, {})
        buf = steps.get(step_id)
        if buf is None or buf.attempt != attempt:
            if buf is not None and buf.attempt > attempt:
                return  # a late piece of an attempt already replaced
            buf = steps[step_id] = _Text(attempt)
        buf.add(text)
        for wake in tuple(self._wakes.get(run_id, ())):
            wake()

    def finished(self, run_id: str, step_id: str, attempt: int) -> None:
        """The attempt's call ended: forget its text soon (its outcome is in the journal)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._forget(run_id, step_id, attempt)
            return
        loop.call_later(KEEP_S, self._forget, run_id, step_id, attempt)

    def _forget(self, run_id: str, step_id: str, attempt: int) -> None:
        steps = self._texts.get(run_id)
        if steps is None:
            return
        buf = steps.get(step_id)
        if buf is not None and buf.attempt == attempt:
            del steps[step_id]
        if not steps:
            del self._texts[run_id]

    def follow(self, run_id: str, wake: Wake) -> Follower:
        """Follow the run's live text; ``wake()`` is called whenever some arrives."""
        self._wakes.setdefault(run_id, set()).add(wake)
        return Follower(self, run_id, wake)

    def _unfollow(self, run_id: str, wake: Wake) -> None:
        wakes = self._wakes.get(run_id)
        if wakes is not None:
            wakes.discard(wake)
            if not wakes:
                del self._wakes[run_id]

    def _buffers(self, run_id: str) -> dict[str, _Text]:
        return self._texts.get(run_id, {})


class Follower:
    """One follower of a run's live text: what it has passed on of each step's buffer."""

    def __init__(self, live: LiveText, run_id: str, wake: Wake) -> None:
        self._live = live
        self.run_id = run_id
        self._wake = wake
        self._sent: dict[str, tuple[int, int]] = {}  # step -> (attempt, chars passed on)

    def take(self) -> list[Delta]:
        """The text that arrived since the last take, one delta per step attempt."""
        out: list[Delta] = []
        for step, buf in self._live._buffers(self.run_id).items():
            attempt, sent = self._sent.get(step, (0, 0))
            if buf.attempt < attempt:
                continue
            if buf.attempt > attempt:
                sent = 0
            if buf.size > sent:
                out.append(Delta(step, buf.attempt, buf.since(sent), sent))
                self._sent[step] = (buf.attempt, buf.size)
        return out

    def close(self) -> None:
        self._live._unfollow(self.run_id, self._wake)

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
