"""A workload that tries to get out of its VM and says what it managed."""

from __future__ import annotations

import functools
import importlib
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

# At run time the workload imports nothing of Lantern but the registration of its entrypoint
# (standard library only): a VM runs nothing its app does not register.
from lantern.workload.entrypoints import entrypoint

if TYPE_CHECKING:  # for the type checker only
    from lantern.workload import Context


def _try(fn: Callable[[], object]) -> dict[str, Any]:
    try:
        return {"ok": True, "value": fn()}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write_app() -> str:
    with open("/app/written-by-vm", "w") as f:
        f.write("x")
    return "written"


def _connect(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        return s.recv(16).decode()


def _processes(marker: str) -> list[str]:
    found: list[str] = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(pid)
            except OSError:
                pass
    return found


def _through_proc(relative: str, absolute: str) -> list[str]:
    """Every ``/proc/PID/cwd/<relative>`` and ``/proc/PID/root<absolute>`` that reads: the way
    to a node's files through its own process, were it visible."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            for path in (f"/proc/{pid}/cwd/{relative}", f"/proc/{pid}/root{absolute}"):
                if _try(functools.partial(_read, path))["ok"]:
                    found.append(path)
    return found


@entrypoint
async def peek(ctx: Context, paths: list[str], relative: str, absolute: str) -> dict[str, Any]:
    """Tries to read the node's data folder: by its host paths, beside ``/app`` and through
    ``/proc``."""
    return {
        "read": {p: _try(functools.partial(_read, p)) for p in paths},
        "proc": _through_proc(relative, absolute),
        "top": _try(lambda: sorted(os.listdir("/"))),
    }


@entrypoint
async def escape(
    ctx: Context,
    host_files: list[str],
    port: int,
    marker: str,
    env_name: str,
    attack: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``attack``: hostile.attack's input, tried in the same VM (one boot where boots are slow).
    ``host_files[0]`` lies in the folder the node (here the test) runs in, as a node's
    ``.lantern/`` does: tried through ``/proc`` as well."""
    # Beside this module in the guest's /app (and no package the type checker knows).
    try_root = importlib.import_module("hostile").attack

    return {
        "attack": None if attack is None else await try_root(ctx, **attack),
        "read": [_try(functools.partial(_read, p)) for p in host_files],
        "proc": _through_proc(os.path.basename(host_files[0]), host_files[0]),
        "root": _try(lambda: os.listdir("/root")),
        "write_app": _try(_write_app),
        "connect": _try(lambda: _connect(port)),
        "processes": _processes(marker),
        "env": os.environ.get(env_name),
        "app": _try(lambda: sorted(os.listdir("/app"))),
        "uid": os.getuid(),
        "kernel": f"{os.uname().sysname} {os.uname().release}",
    }
