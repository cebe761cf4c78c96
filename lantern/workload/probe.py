"""The workload ``lantern runtime check`` boots: it says what kernel it found."""

from __future__ import annotations

import os
from typing import Any


async def ping(ctx: Any) -> dict[str, str]:
    uname = os.uname()
    return {"kernel": f"{uname.sysname} {uname.release}", "host": uname.nodename}
