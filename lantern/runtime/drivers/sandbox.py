"""``sandbox``: bubblewrap namespaces. Not a VM: the workload runs on the host's kernel.

What it gives: its own user, PID, network, IPC, UTS and cgroup namespaces (no network at all:
only a loopback of its own), a root made of the read-only shares of :mod:`.base`, a private
``/tmp``, no host environment, and ``PR_SET_NO_NEW_PRIVS``. Memory is capped with
``RLIMIT_AS`` (address space, a looser bound than a VM's RAM). A kernel bug is a way out,
as for any container.
"""

from __future__ import annotations

import asyncio
import resource
import shutil

from lantern.runtime.drivers.base import (
    GUEST_APP,
    Driver,
    ProcessVm,
    VmSpec,
    die_with_node,
    guest_env,
    harness_argv,
    log_file,
    shares,
    usr_links,
)


class SandboxDriver(Driver):
    name = "sandbox"
    isolation = "bubblewrap namespaces on the host kernel (not a VM)"
    strength = 1

    def unavailable(self) -> str | None:
        if shutil.which("bwrap") is None:
            return "bwrap is not installed (Debian package bubblewrap)"
        return None

    def argv(self, spec: VmSpec) -> list[str]:
        args = [
            "bwrap",
            "--unshare-all",  # user, pid, net, ipc, uts, cgroup
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            "--hostname",
            "lantern-vm",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
        ]
        for share in shares(spec.app_dir):
            args += ["--ro-bind", share.host, share.guest]
        for link, target in usr_links().items():
            args += ["--symlink", target, link]
        for key, value in guest_env(spec, "stdio").items():
            args += ["--setenv", key, value]
        return [*args, "--chdir", GUEST_APP, "--", *harness_argv()]

    async def start(self, spec: VmSpec) -> ProcessVm:
        log_path = spec.files() / "console.log"
        limit = spec.memory_mb * 1024 * 1024

        def cap() -> None:
            die_with_node()
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        with log_file(log_path) as log:
            process = await asyncio.create_subprocess_exec(
                *self.argv(spec),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                preexec_fn=cap,
                start_new_session=True,
                limit=16 * 1024 * 1024,
            )
        return ProcessVm(process, log_path)
