"""The one interface every driver implements, and the guest layout they all give a VM.

A driver starts a VM from a :class:`VmSpec` and hands back a :class:`Vm`: a channel (an
asyncio stream pair: the VM's only way out), ``wait()`` for its exit code, ``kill()``. What
the guest sees is the same under every driver, shared read-only and curated, never the
host's whole root (credentials live under ``/root``):

- the host's ``/usr`` (with ``/bin``, ``/lib``, ``/lib64``, ``/sbin`` as on the host), the
  Python installation at its own path, the ``lantern`` package under ``/opt/lantern/src`` and the
  virtualenv's packages at ``/opt/lantern/site`` (so an app that imports ``lantern`` works);
- the node's app directory at ``/app``, and the node's bytecode of it and of
  ``lantern.workload`` at ``/opt/lantern/pycache`` (``PYTHONPYCACHEPREFIX``; runtime/bytecode.py);
- a private ``/tmp``, its own ``/proc``, a minimal ``/dev``; no network; an environment of
  the harness's own variables only.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import ctypes
import os
import signal
import site
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import lantern
from lantern.runtime.bytecode import GUEST_CACHE, cache_dir

GUEST_APP = "/app"
GUEST_SRC = "/opt/lantern/src"
GUEST_SITE = "/opt/lantern/site"


class DriverUnavailable(Exception):
    """This host cannot run the driver; the message says why."""


@dataclass(frozen=True)
class VmSpec:
    vm_id: str
    app_dir: Path
    env: dict[str, str] = field(default_factory=dict)  # the harness's own (LANTERN_RESUME...)
    memory_mb: int = 512
    vcpus: int = 1
    workdir: Path | None = None  # the node's own files for this VM (console log, sockets)
    log_bytes: int = 8 * 1024 * 1024  # LANTERN_VM_LOG_BYTES: the console log's cap, tail kept

    def files(self) -> Path:
        """The VM's host-side directory, made on first use."""
        path = self.workdir or Path(tempfile.gettempdir()) / "lantern-vms" / self.vm_id
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path


@dataclass(frozen=True)
class Share:
    """A host directory (or file) the guest sees read-only at ``guest``."""

    host: str
    guest: str


def python_home() -> str:
    """The Python installation the host runs (a virtualenv's base, not the venv)."""
    return sys.base_prefix


def python_binary() -> str:
    return os.path.realpath(sys.executable)


def source_root() -> str:
    """The directory holding the ``lantern`` package."""
    return str(Path(lantern.__file__).resolve().parent.parent)


def site_packages() -> str | None:
    path = sysconfig.get_paths()["purelib"]
    return path if sys.prefix != sys.base_prefix and os.path.isdir(path) else None


def guest_path() -> str:
    """The guest's whole ``sys.path`` beyond the standard library: the harness runs with
    ``python -S``, so no ``site`` module adds (or runs the ``.pth`` hooks of) anything else.
    Outside a virtualenv the installation's own package directories, shared with it."""
    paths = [GUEST_APP, GUEST_SRC]
    if site_packages() is not None:
        paths.append(GUEST_SITE)
    else:
        paths += [p for p in site.getsitepackages() if os.path.isdir(p)]
    return ":".join(paths)


def shares(app_dir: Path) -> list[Share]:
    """What every guest sees, read-only."""
    found = [Share("/usr", "/usr"), Share(python_home(), python_home())]
    if os.path.exists("/etc/ld.so.cache"):
        found.append(Share("/etc/ld.so.cache", "/etc/ld.so.cache"))
    # The package alone: the checkout around it may hold a database and signing keys.
    found.append(Share(os.path.join(source_root(), "lantern"), f"{GUEST_SRC}/lantern"))
    site = site_packages()
    if site is not None:
        found.append(Share(site, GUEST_SITE))
    found.append(Share(str(app_dir.resolve()), GUEST_APP))
    cache = cache_dir(app_dir)
    if cache is not None:  # the node's bytecode of the app and lantern.workload (bytecode.py)
        found.append(Share(str(cache), GUEST_CACHE))
    return found


def usr_links() -> dict[str, str]:
    """``/bin`` and friends as the host has them: links into ``/usr`` on a merged-usr host."""
    links = {}
    for name in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):
            links[path] = os.readlink(path)
    return links


def guest_env(spec: VmSpec, channel: str) -> dict[str, str]:
    """The whole environment of the harness: nothing of the host's."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONPATH": guest_path(),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPYCACHEPREFIX": GUEST_CACHE,
        "PYTHONUNBUFFERED": "1",
        "LANTERN_CHANNEL": channel,
        "LANTERN_APP_DIR": GUEST_APP,
        "LANTERN_VM_ID": spec.vm_id,
        **spec.env,
    }


# The harness needs nothing of Lantern but ``lantern.workload``, so the guest imports it without
# running ``lantern/__init__`` (which pulls in the server's dependencies: half a second a start
# under bubblewrap). The package's own ``__init__`` runs the first time a workload asks it for
# something (``lantern.App``), so an app that imports ``lantern`` still works.
BOOT = """
import importlib.util, sys, types
spec = importlib.util.find_spec("lantern")
pkg = importlib.util.module_from_spec(spec)
class Lazy(types.ModuleType):
    def __getattr__(self, name):
        self.__class__ = types.ModuleType
        spec.loader.exec_module(self)
        return getattr(self, name)
pkg.__class__ = Lazy
sys.modules["lantern"] = pkg
from lantern.workload.harness import main
sys.exit(main())
"""


def harness_argv() -> list[str]:
    return [python_binary(), "-S", "-c", BOOT]


class Vm(abc.ABC):
    """A started VM. ``reader``/``writer`` are its channel."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    @abc.abstractmethod
    async def wait(self) -> int:
        """The exit code of the harness (or of the VM), once it has ended."""

    @abc.abstractmethod
    def kill(self) -> None:
        """End the VM now; ``wait()`` then returns."""

    @property
    @abc.abstractmethod
    def log(self) -> str:
        """What the guest wrote to its console (the last part of it)."""


class Driver(abc.ABC):
    name: ClassVar[str]
    isolation: ClassVar[str]  # what it is, said plainly: gVisor and bubblewrap are no VMs
    strength: ClassVar[int]  # auto picks the highest that works
    # Warm VMs a runtime node keeps booted by default (``lantern node --warm``): worth their
    # memory where a boot takes seconds.
    warm: ClassVar[int] = 0

    @abc.abstractmethod
    def unavailable(self) -> str | None:
        """Why this host cannot run the driver (a quick look: binaries, devices), or None."""

    @abc.abstractmethod
    async def start(self, spec: VmSpec) -> Vm: ...


def die_with_node() -> None:
    """In a VM's host process, before exec: it gets SIGKILL when its runtime node dies, so a
    SIGKILLed node leaves no VM working on behind it (``prctl(PR_SET_PDEATHSIG)``)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def log_file(path: Path) -> Iterator[int]:
    """A helper process's own log (virtiofsd's), as a descriptor to hand to the child."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        yield fd
    finally:
        os.close(fd)


class ConsoleLog:
    """A VM's console log on the host, at most ``cap`` bytes, the tail kept: it is written in
    two halves, ``console.log`` and ``console.log.1`` (the older), and a half that is full
    replaces the older one. A workload writing without end costs the node ``cap`` bytes."""

    def __init__(self, path: Path, cap: int) -> None:
        self.path = path
        self.older = path.with_name(path.name + ".1")
        self.half = max(1, cap // 2)
        self._size = 0
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)

    def write(self, data: bytes) -> None:
        while data:
            if self._size >= self.half:
                os.close(self._fd)
                os.replace(self.path, self.older)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                self._size = 0
            part = data[: self.half - self._size]
            os.write(self._fd, part)
            self._size += len(part)
            data = data[len(part) :]

    async def follow(self, stream: asyncio.StreamReader | None) -> None:
        """Copy what the VM writes on ``stream`` until it closes it."""
        if stream is None:
            return
        try:
            while chunk := await stream.read(65536):
                self.write(chunk)
        finally:
            os.close(self._fd)

    def tail(self, size: int) -> str:
        found = b""
        for path in (self.path, self.older):
            if len(found) >= size:
                break
            try:
                with open(path, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    f.seek(max(0, f.tell() - (size - len(found))))
                    found = f.read() + found
            except OSError:
                pass
        return found.decode(errors="replace")


class ProcessVm(Vm):
    """A VM that is one host process speaking the channel on its stdin and stdout, its console
    on its stderr (a pipe the node copies into the capped :class:`ConsoleLog`)."""

    def __init__(self, process: asyncio.subprocess.Process, console: ConsoleLog) -> None:
        self.process = process
        assert process.stdout is not None and process.stdin is not None
        self.reader = process.stdout
        self.writer = process.stdin
        self.console = console
        self._copy = asyncio.ensure_future(console.follow(process.stderr))

    async def wait(self) -> int:
        code = await self.process.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._copy), 5)
        return code

    def kill(self) -> None:
        if self.process.returncode is None:
            try:
                self.process.kill()
            except ProcessLookupError:
                pass

    @property
    def log(self) -> str:
        return self.console.tail(8192)
