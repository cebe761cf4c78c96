"""``sandbox``: bubblewrap namespaces. Not a VM: the workload runs on the host's kernel.

What it gives: its own user, PID, network, IPC, UTS and cgroup namespaces (no network at all:
only a loopback of its own), a root made of the read-only shares of :mod:`.base`, a private
``/tmp``, no host environment. The workload holds no capability in any namespace, runs as
``nobody`` (uid and gid 65534) inside its user namespace, cannot make another one
(``--disable-userns``), has ``PR_SET_NO_NEW_PRIVS`` and a seccomp filter (:mod:`.seccomp`),
and a session of its own (no ``TIOCSTI`` into the node's terminal). So on a node that runs as
root its read-only shares stay read-only: remounting them takes ``CAP_SYS_ADMIN``. Memory is
capped with ``RLIMIT_AS`` (address space, a looser bound than a VM's RAM). A kernel bug is a
way out, as for any container.

Run as root, bubblewrap maps the workload's uid to root's outside its namespace (it maps only
the uid that runs it): file permissions on the host would treat it as root's, which is why
nothing of the host is shared writable and no capability is left to change that.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil

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
from lantern.runtime.drivers.seccomp import SeccompUnavailable, descriptor, program

GUEST_UID = GUEST_GID = 65534  # nobody, nogroup


class SandboxDriver(Driver):
    name = "sandbox"
    isolation = "bubblewrap namespaces on the host kernel (not a VM)"
    strength = 1

    def unavailable(self) -> str | None:
        if shutil.which("bwrap") is None:
            return "bwrap is not installed (Debian package bubblewrap)"
        try:
            program()
        except SeccompUnavailable as exc:
            return str(exc)
        return None

    def argv(self, spec: VmSpec, seccomp_fd: int) -> list[str]:
        args = [
            "bwrap",
            "--unshare-all",  # pid, net, ipc, uts, cgroup
            # A user namespace even when run as root, where bubblewrap would otherwise keep
            # root's capabilities; in it the workload is nobody, with none, for good.
            "--unshare-user",
            "--uid",
            str(GUEST_UID),
            "--gid",
            str(GUEST_GID),
            "--cap-drop",
            "ALL",
            "--disable-userns",
            "--seccomp",
            str(seccomp_fd),
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

        seccomp = descriptor()
        try:
            process = await asyncio.create_subprocess_exec(
                *self.argv(spec, seccomp),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                preexec_fn=cap,
                start_new_session=True,
                pass_fds=(seccomp,),
                limit=16 * 1024 * 1024,
            )
        finally:
            os.close(seccomp)
        return ProcessVm(process, ConsoleLog(log_path, spec.log_bytes))
