"""The workload ``lantern runtime check`` boots: it says what kernel it found and with which
privileges it runs (a driver whose workloads keep root's is refused)."""

from __future__ import annotations

import os
from typing import Any

from lantern.workload.entrypoints import entrypoint


def _cap_eff() -> str:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


@entrypoint
async def ping(ctx: Any) -> dict[str, Any]:
    uname = os.uname()
    return {
        "kernel": f"{uname.sysname} {uname.release}",
        "host": uname.nodename,
        "uid": os.getuid(),
        "capEff": _cap_eff(),
    }
