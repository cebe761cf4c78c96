"""A workload that tries to become root on its host: it reads its capabilities, remounts its
read-only shares writable and writes into each of them (the host's /usr, the lantern package,
the virtualenv's packages, the app folder), and says what it managed."""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

# At run time the workload imports nothing of Lantern but the registration of its entrypoint
# (standard library only): a VM runs nothing its app does not register.
from lantern.workload.entrypoints import entrypoint

if TYPE_CHECKING:  # for the type checker only
    from lantern.workload import Context

MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096


def _try(fn: Callable[[], object]) -> dict[str, Any]:
    try:
        return {"ok": True, "value": fn()}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def _status(field: str) -> str:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
    return ""


def _remount(path: str) -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    flags = MS_REMOUNT | MS_BIND
    if libc.mount(None, path.encode(), None, flags, None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return "remounted writable"


def _write(path: str) -> str:
    with open(path, "w") as f:
        f.write("written by a hostile workload")
    return "written"


def _unshare_user() -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER: a namespace where it would be root again
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return "unshared"


@entrypoint
async def attack(ctx: Context, targets: dict[str, str], name: str) -> dict[str, Any]:
    """``targets``: a share's mount point in the guest -> a directory inside it to write to."""
    return {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "capEff": _status("CapEff"),
        "noNewPrivs": _status("NoNewPrivs"),
        "seccomp": _status("Seccomp"),
        "remount": {s: _try(functools.partial(_remount, s)) for s in targets},
        "write": {
            s: _try(functools.partial(_write, os.path.join(d, name))) for s, d in targets.items()
        },
        "unshare": _try(_unshare_user),
    }


@entrypoint
async def noisy(ctx: Context, megabytes: int, last: str) -> str:
    """Floods its console (stderr), then writes ``last``: what a capped log must keep."""
    import sys

    line = "x" * 1023 + "\n"
    for _ in range(megabytes * 1024):
        sys.stderr.write(line)
    sys.stderr.write(last + "\n")
    sys.stderr.flush()
    return "flooded"
