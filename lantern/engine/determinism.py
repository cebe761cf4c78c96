"""A code-first run's step ids, and the check a re-drive makes against its journal (no I/O).

Each ``ctx`` call names its step; the same name again in one run gets ``name#2``,
``name#3``, ... in call order, so a step id is a pure function of the calls made so far. A
re-drive runs the function again from the top: the k-th call must ask for the k-th step the
journal holds. Any other name there means the code between steps was not deterministic (or
the code changed), and going on would pair journaled outputs with the wrong calls: the run
fails with error code ``nondeterminism``, naming the position, the journaled name and the
requested one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lantern.errors import UsageError

NONDETERMINISM = "nondeterminism"
MAX_NAME = 200
RETURNED = "(the function returned)"


def check_name(name: Any, call: str = "ctx.step") -> str:
    """A step name as given by the user, or a one-line UsageError saying what is wrong."""
    if not isinstance(name, str):
        raise UsageError(f"{call}: the step name must be a string, not {type(name).__name__}")
    if not name or len(name) > MAX_NAME:
        raise UsageError(f"{call}: the step name must be 1-{MAX_NAME} characters")
    if "#" in name:
        raise UsageError(
            f"{call}({name!r}): a step name may not contain '#' (repeats are numbered name#2)"
        )
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        raise UsageError(f"{call}({name!r}): a step name may not contain control characters")
    return name


class StepNames:
    """The ids of one drive's calls, in call order."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}
        self.order: list[str] = []

    def next(self, name: str) -> str:
        count = self._seen.get(name, 0) + 1
        self._seen[name] = count
        step = name if count == 1 else f"{name}#{count}"
        self.order.append(step)
        return step

    @property
    def position(self) -> int:
        """The 1-based position of the latest call."""
        return len(self.order)


@dataclass(frozen=True)
class Mismatch:
    position: int  # 1-based
    journaled: str
    requested: str

    def error(self) -> dict[str, Any]:
        """The run's error: what ``GET /v1/runs/{id}`` and ``lantern runs show`` say."""
        return {
            "code": NONDETERMINISM,
            "position": self.position,
            "journaled": self.journaled,
            "requested": self.requested,
            "message": (
                f"step {self.position} of the journal is {self.journaled!r} but the code asked"
                f" for {self.requested!r}: code between steps must be deterministic, and a run"
                " is replayed by the code that started it"
            ),
        }


def mismatch(journal: Sequence[str], position: int, requested: str) -> Mismatch | None:
    """``requested``, the ``position``-th call's step id, against the journal's order."""
    if position <= len(journal) and journal[position - 1] != requested:
        return Mismatch(position, journal[position - 1], requested)
    return None


def unfinished(journal: Sequence[str], calls: int) -> Mismatch | None:
    """The function returned after ``calls`` calls: a journal holding more steps than that
    was written by other code."""
    if calls < len(journal):
        return Mismatch(calls + 1, journal[calls], RETURNED)
    return None
