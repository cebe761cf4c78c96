"""The app the crash tests load with --app: a test-build hook that SIGKILLs its own process.

``LANTERN_TEST_CRASH_AFTER=step_completed:s2`` kills the process right after the commit that
journals step s2's completion, before step s3 is invoked. The hook lives here, in the test
build, and reaches the engine only through the public ``App.on_commit`` observer.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence

import lantern
from lantern.store import NewEvent

app = lantern.App()
_CRASH_AFTER = os.environ.get("LANTERN_TEST_CRASH_AFTER", "")


@app.on_commit
def crash_after(run_id: str, events: Sequence[NewEvent]) -> None:
    if not _CRASH_AFTER:
        return
    kind, _, step = _CRASH_AFTER.partition(":")
    if any(e.kind == kind and e.step_id == step for e in events):
        os.kill(os.getpid(), signal.SIGKILL)


@app.tool("noop")
async def noop(**kwargs: object) -> dict[str, object]:
    return dict(kwargs)
