"""The seccomp filter of the ``sandbox`` driver's workloads, compiled by libseccomp.

bubblewrap loads a filter from a descriptor (``--seccomp FD``) as its last act before it runs
the workload. The program is compiled once per node process by libseccomp (through its ctypes
binding ``pyseccomp``), not written by hand: libseccomp knows each architecture's numbers and
rejects the other ABIs a process could switch to (i386 through ``int 0x80``, x32).

What it refuses is what the kernel would let a process without capabilities still try, the
way into most container escapes (Docker's and Flatpak's default profiles refuse the same):
mounts of any kind, new namespaces (where the workload would be root again), ``ptrace`` and
the other ways into another process, kernel keyrings, BPF, ``perf_event_open``,
``userfaultfd``, ``io_uring`` (which performs system calls no filter sees), module loading,
handles to files by inode, and pushing characters into a terminal (``TIOCSTI``). Everything a
Python workload and the programs it may start use stays allowed.
"""

from __future__ import annotations

import errno
import functools
import os

# Refused with EPERM, as a kernel refuses a process that lacks the capability.
DENIED = (
    # mounts and roots
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr",
    # namespaces: a new user namespace would give the workload every capability inside it
    "unshare", "setns",
    # other processes and the kernel's own state
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "fanotify_init",
    "reboot", "swapon", "swapoff", "syslog", "acct", "quotactl", "quotactl_fd", "vhangup",
    "iopl", "ioperm", "uselib", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "sethostname", "setdomainname",
)  # fmt: skip
# clone's flags that make a namespace (CLONE_NEWNS ... CLONE_NEWNET), one rule each.
CLONE_NAMESPACES = (
    0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000,
)  # fmt: skip
TIOCSTI, TIOCLINUX = 0x5412, 0x541C


class SeccompUnavailable(Exception):
    """libseccomp cannot be loaded here."""


@functools.cache
def program() -> bytes:
    """The filter as the BPF program the kernel loads (compiled once per process)."""
    try:
        import pyseccomp as sc
    except (ImportError, RuntimeError, OSError) as exc:
        raise SeccompUnavailable(
            f"libseccomp cannot be loaded ({exc}): install Debian's libseccomp2"
        ) from exc
    f = sc.SyscallFilter(sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)
    for name in DENIED:
        try:
            f.add_rule(deny, name)
        except (OSError, ValueError):
            pass  # a system call this libseccomp does not know: the kernel has none either
    for flag in CLONE_NAMESPACES:
        f.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    # clone3 takes its flags in memory, where a filter cannot look: ENOSYS makes the C
    # library fall back to clone, whose flags the rules above see.
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for request in (TIOCSTI, TIOCLINUX):
        f.add_rule(deny, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    fd = os.memfd_create("lantern-seccomp")
    with os.fdopen(fd, "w+b") as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


def descriptor() -> int:
    """A new descriptor holding the program from its start, for bubblewrap to read (the
    caller hands it to the child with ``pass_fds`` and closes it)."""
    fd = os.memfd_create("lantern-seccomp")
    os.write(fd, program())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
