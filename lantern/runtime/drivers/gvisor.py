"""``gvisor``: gVisor's ``runsc``, a user-space kernel (the Sentry) between the workload and
the host. Not a hardware VM, but the workload's system calls never reach the host kernel
directly: they are served by gVisor, here intercepted with ``ptrace`` (the Debian build has no
``systrap``; KVM mode needs a standard KVM).

Each VM is an OCI bundle whose root is an empty read-only directory holding only the mount
points of the read-only shares of :mod:`.base`; ``--network=none`` leaves it a loopback of its
own. The workload runs as ``nobody`` with no capability and no new privileges. Memory is capped
with ``RLIMIT_AS`` inside the sandbox.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

from lantern.runtime.drivers.base import (
    GUEST_APP,
    ConsoleLog,
    Driver,
    ProcessVm,
    VmSpec,
    die_with_node,
    guest_env,
    harness_argv,
    shares,
    usr_links,
)

CAPABILITY_SETS = ("bounding", "effective", "inheritable", "permitted", "ambient")


class GVisorVm(ProcessVm):
    def __init__(
        self, process: asyncio.subprocess.Process, log: ConsoleLog, root: Path, cid: str
    ) -> None:
        super().__init__(process, log)
        self._root = root
        self._cid = cid

    def kill(self) -> None:
        # Killing ``runsc run`` alone could leave its sandbox behind: ask runsc to end it.
        if self.process.returncode is None:
            os.spawnvp(
                os.P_NOWAIT,
                "runsc",
                ["runsc", "--root", str(self._root), "kill", "--all", self._cid, "KILL"],
            )
        super().kill()

    async def wait(self) -> int:
        code = await super().wait()
        cleanup = await asyncio.create_subprocess_exec(
            "runsc",
            "--root",
            str(self._root),
            "delete",
            "--force",
            self._cid,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await cleanup.wait()
        return code


class GVisorDriver(Driver):
    name = "gvisor"
    isolation = "gVisor user-space kernel, ptrace platform (not a hardware VM)"
    strength = 2

    def unavailable(self) -> str | None:
        if shutil.which("runsc") is None:
            return "runsc is not installed (Debian package runsc)"
        return None

    def bundle(self, spec: VmSpec) -> Path:
        bundle = spec.files() / "bundle"
        rootfs = bundle / "rootfs"
        rootfs.mkdir(parents=True, exist_ok=True)
        mounts: list[dict[str, Any]] = [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]},
        ]
        for point in ("proc", "tmp", "dev"):
            (rootfs / point).mkdir(exist_ok=True)
        for share in shares(spec.app_dir):
            target = rootfs / share.guest.lstrip("/")
            if os.path.isdir(share.host):
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.touch()
            mounts.append(
                {
                    "destination": share.guest,
                    "type": "bind",
                    "source": share.host,
                    "options": ["rbind", "ro"],
                }
            )
        for link, to in usr_links().items():
            path = rootfs / link.lstrip("/")
            if not path.is_symlink():
                path.symlink_to(to)
        limit = spec.memory_mb * 1024 * 1024
        config = {
            "ociVersion": "1.0.0",
            "process": {
                "terminal": False,
                # nobody, with no capability: gVisor's root is not the host's, but a workload
                # needs neither, and a Sentry bug is then one step further from anything.
                "user": {"uid": 65534, "gid": 65534},
                "capabilities": {k: [] for k in CAPABILITY_SETS},
                "args": harness_argv(),
                "env": [f"{k}={v}" for k, v in guest_env(spec, "stdio").items()],
                "cwd": GUEST_APP,
                "noNewPrivileges": True,
                "rlimits": [{"type": "RLIMIT_AS", "hard": limit, "soft": limit}],
            },
            "root": {"path": "rootfs", "readonly": True},
            "hostname": "lantern-vm",
            "mounts": mounts,
            "linux": {
                "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]
            },
        }
        (bundle / "config.json").write_text(json.dumps(config))
        return bundle

    async def start(self, spec: VmSpec) -> GVisorVm:
        files = spec.files()
        bundle = self.bundle(spec)
        state = files / "runsc"
        state.mkdir(exist_ok=True)
        log_path = files / "console.log"
        cid = spec.vm_id
        argv = [
            "runsc",
            "--root",
            str(state),
            "--network=none",
            "--platform=ptrace",
            "--ignore-cgroups",
            "run",
            "--bundle",
            str(bundle),
            cid,
        ]
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            preexec_fn=die_with_node,
            limit=16 * 1024 * 1024,
        )
        return GVisorVm(process, ConsoleLog(log_path, spec.log_bytes), state, cid)
