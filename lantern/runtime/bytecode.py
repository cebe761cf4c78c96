"""Bytecode for what a VM imports, compiled on the host before the VM needs it.

A guest sees the app directory and the ``lantern`` package read-only, so Python there cannot
cache what it compiles: without this, every VM compiled ``lantern.workload`` and the app's
modules again at each boot, slowly under software emulation. The runtime node writes the
``__pycache__`` Python would write on a first import on the host; the guest finds it next to
the sources (their mtimes match through the share).
Where the node cannot write, nothing fails: VMs compile as before.
"""

from __future__ import annotations

import compileall
import os
from pathlib import Path

# Not the app's own code: virtualenvs, hidden directories (.git), node_modules.
_SKIP = {"__pycache__", "node_modules", "site-packages"}


def precompile(*directories: Path) -> None:
    """Compile every module under ``directories`` whose bytecode is missing or stale (a
    ``stat`` and a 12-byte read per module otherwise)."""
    for directory in directories:
        for parent, dirs, files in os.walk(directory):
            dirs[:] = [d for d in dirs if d not in _SKIP and not d.startswith(".")]
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(parent, name)
                    compileall.compile_file(path, quiet=2, optimize=0)
