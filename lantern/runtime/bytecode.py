"""Bytecode for what a VM imports, compiled on the host before the VM needs it, and kept out
of the user's app folder.

A guest sees the app directory and the ``lantern`` package read-only, so Python there cannot
cache what it compiles: without this, every VM compiled ``lantern.workload`` and the app's
modules again at each boot, slowly under software emulation. The runtime node compiles them
into a cache folder of its own, laid out as ``sys.pycache_prefix`` wants it for the paths the
guest sees the sources at (``/app/jobs.py`` -> ``<cache>/app/jobs.cpython-311.pyc``); the
guest sees that folder read-only at ``GUEST_CACHE`` with ``PYTHONPYCACHEPREFIX`` pointing at
it. The node never writes ``__pycache__`` into the ``--app`` folder, which is the user's.
Where the node cannot keep a cache of its own, nothing fails: VMs compile as before.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import py_compile
import stat
import sys
import tempfile
from pathlib import Path

GUEST_CACHE = "/opt/lantern/pycache"

# Not the app's own code: virtualenvs, hidden directories (.git), node_modules.
_SKIP = {"__pycache__", "node_modules", "site-packages"}


def cache_dir(app_dir: Path) -> Path | None:
    """The node's bytecode folder for ``app_dir`` (one per app folder: every app is ``/app``
    in its guests), or None where it cannot be this user's alone (a shared temporary folder
    where another user made it first could hand VMs bytecode of theirs)."""
    root = Path(tempfile.gettempdir()) / f"lantern-bytecode-{os.getuid()}"
    try:
        root.mkdir(mode=0o755, exist_ok=True)
        st = root.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    digest = hashlib.sha256(str(app_dir.resolve()).encode()).hexdigest()[:16]
    found = root / digest
    found.mkdir(mode=0o755, exist_ok=True)
    return found


def precompile(cache: Path | None, *trees: tuple[Path, str]) -> None:
    """Compile every module of each ``(host folder, the guest's path of it)`` into ``cache``
    where its bytecode is missing or stale (a ``stat`` and a 16-byte read per module
    otherwise)."""
    if cache is None:
        return
    tag = sys.implementation.cache_tag
    for host_root, guest_root in trees:
        for parent, dirs, files in os.walk(host_root):
            dirs[:] = [d for d in dirs if d not in _SKIP and not d.startswith(".")]
            guest_parent = os.path.normpath(
                os.path.join(guest_root, os.path.relpath(parent, host_root))
            )
            for name in files:
                if not name.endswith(".py"):
                    continue
                source = os.path.join(parent, name)
                target = cache / guest_parent.lstrip("/") / f"{name[:-3]}.{tag}.pyc"
                if not _fresh(source, target):
                    guest = os.path.join(guest_parent, name)  # what tracebacks in the VM name
                    py_compile.compile(source, cfile=str(target), dfile=guest, quiet=2)


def _fresh(source: str, target: Path) -> bool:
    """Whether ``target`` holds the bytecode of ``source`` as it is now (the header Python
    itself checks: magic, flags, the source's mtime and size)."""
    try:
        st = os.stat(source)
        with open(target, "rb") as f:
            header = f.read(16)
    except OSError:
        return False
    mask = 0xFFFFFFFF
    expected = (
        importlib.util.MAGIC_NUMBER
        + (0).to_bytes(4, "little")
        + (int(st.st_mtime) & mask).to_bytes(4, "little")
        + (st.st_size & mask).to_bytes(4, "little")
    )
    return header == expected
