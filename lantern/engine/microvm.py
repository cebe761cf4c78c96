"""A microVM agent: the ``runtime`` block (docs/runtime.md), validated with every problem at once.

The engine only knows that such a run is not driven here: the scheduler of the microVM tier
places it in a VM, and the VM's reports are journaled by the relay. This module is the pure
part, so the engine can tell a microVM agent apart without importing the tier.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lantern.engine import anomalies

DRIVER_NAMES = ("auto", "qemu", "gvisor", "sandbox")
MAX_RESUME_ATTEMPTS = 3  # maxMicroVMResumeAttempts: VMs a run may have, its first included
_ENTRYPOINT = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_KEYS = {"tier", "entrypoint", "driver", "memoryMb", "vcpus", "timeoutS", "network"}
_LIMITS = {"memoryMb": (64, 65536, 512), "vcpus": (1, 64, 1), "timeoutS": (1, 86400, 900)}


@dataclass(frozen=True)
class MicroVmAgent:
    name: str
    entrypoint: str
    driver: str = "auto"
    memory_mb: int = 512
    vcpus: int = 1
    timeout_s: int = 900
    network: str = "none"
    budget: Mapping[str, Any] | None = None  # the agent's {maxUsd, maxTokens}, as a graph's
    # anomaly kind -> its limits and policy (lantern.engine.anomalies), as a graph's
    anomalies: Mapping[str, dict[str, Any]] = field(default_factory=lambda: anomalies.settings({}))


def parse_microvm(name: str, definition: dict[str, Any], problems: list[str]) -> MicroVmAgent:
    """The agent's runtime block; its problems are appended to ``problems``."""
    block = definition.get("runtime")
    if not isinstance(block, dict):
        problems.append("runtime must be an object")
        return MicroVmAgent(name, "")
    for other in ("graph", "model"):
        if other in definition:
            problems.append(
                f"an agent with a runtime block has no {other!r}: its code is the agent"
            )
    for key in sorted(set(block) - _KEYS):
        problems.append(f"runtime.{key} is not a runtime setting ({', '.join(sorted(_KEYS))})")
    if block.get("tier") != "microvm":
        problems.append("runtime.tier must be 'microvm'")
    entrypoint = block.get("entrypoint")
    if not isinstance(entrypoint, str) or not _ENTRYPOINT.match(entrypoint):
        problems.append("runtime.entrypoint must be MODULE:FUNCTION, such as 'jobs:scrape'")
        entrypoint = ""
    elif _not_an_app(entrypoint):
        # The VM runs only what the app registers, which only the VM can see (the app folder
        # is a runtime node's); a module of Python's or Lantern's own is never the app's.
        problems.append(
            f"runtime.entrypoint {entrypoint!r} is in Python's or Lantern's own modules: an"
            " entrypoint is a function the app registers (@app.agent or app.entrypoint(fn))"
        )
    driver = block.get("driver", "auto")
    if driver not in DRIVER_NAMES:
        problems.append(
            f"runtime.driver {driver!r} is unknown: use one of {', '.join(DRIVER_NAMES)}"
        )
        driver = "auto"
    numbers = {}
    for key, (low, high, default) in _LIMITS.items():
        value = block.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            problems.append(f"runtime.{key} must be an integer from {low} to {high}")
            value = default
        numbers[key] = value
    network = block.get("network", "none")
    if network != "none":
        problems.append(
            "runtime.network must be 'none': no driver gives a VM a network yet"
            " (an egress allow list is not supported)"
        )
    return MicroVmAgent(
        name,
        entrypoint,
        driver,
        numbers["memoryMb"],
        numbers["vcpus"],
        numbers["timeoutS"],
        budget=definition.get("budget"),
        anomalies=anomalies.settings(definition),
    )


def _not_an_app(entrypoint: str) -> bool:
    top = entrypoint.partition(":")[0].partition(".")[0]
    return top in sys.stdlib_module_names or top == "lantern"
