"""``qemu``: QEMU's ``microvm`` machine, a real VM with a kernel of its own.

KVM with ``-cpu host`` where a standard KVM (``kvm_intel`` or ``kvm_amd``) is usable; software
emulation (TCG) otherwise, which is slower to boot but isolates the same way. The guest boots
the image ``lantern runtime build-image`` made; it sees one virtiofs share, read-only, served
by QEMU's ``virtiofsd`` from a directory of read-only bind mounts (the shares of :mod:`.base`)
that only a private mount namespace holds. It has no network device at all, and its only way
out is a virtio-serial port to a unix socket the runtime node listens on before QEMU starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import shutil
from pathlib import Path

from lantern.runtime.drivers.base import (
    BOOT,
    ConsoleLog,
    Driver,
    DriverUnavailable,
    Vm,
    VmSpec,
    die_with_node,
    guest_env,
    log_file,
    python_binary,
    shares,
    usr_links,
)

VIRTIOFSD = "/usr/lib/qemu/virtiofsd"
DEFAULT_IMAGE = Path(".lantern/runtime")
_EXIT = re.compile(rb"LANTERN_EXIT=(\d+)")


def standard_kvm() -> bool:
    """A KVM that boots any guest: not PVM's (``kvm_pvm``), which boots only patched ones."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    return any(os.path.isdir(f"/sys/module/{m}") for m in ("kvm_intel", "kvm_amd"))


def host_khz() -> int | None:
    """The TSC frequency to tell the guest: without it about one boot in eight hangs under TCG."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return int(float(line.split(":")[1]) * 1000)
    except (OSError, ValueError):
        pass
    return None


class QemuVm(Vm):
    def __init__(
        self,
        qemu: asyncio.subprocess.Process,
        fs: asyncio.subprocess.Process,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        console: ConsoleLog,
        server: asyncio.Server,
    ) -> None:
        self.qemu = qemu
        self.fs = fs
        self.reader = reader
        self.writer = writer
        self.console = console
        self._copy = asyncio.ensure_future(console.follow(qemu.stdout))
        self._server = server

    async def wait(self) -> int:
        await self.qemu.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._copy), 5)
        self.kill()
        await self.fs.wait()
        self.writer.close()
        self._server.close()
        await self._server.wait_closed()
        found = _EXIT.findall(self._tail(4096).encode())
        return int(found[-1]) if found else 137  # no word from the harness: it was killed

    def kill(self) -> None:
        for process in (self.qemu, self.fs):
            if process.returncode is None:
                try:
                    process.kill()
                except ProcessLookupError:
                    pass

    def _tail(self, size: int) -> str:
        return self.console.tail(size)

    @property
    def log(self) -> str:
        return self._tail(8192)


class QemuDriver(Driver):
    name = "qemu"
    isolation = "QEMU microvm, a hardware VM with its own kernel"
    strength = 3
    warm = 1

    def __init__(self, image: Path | None = None) -> None:
        self.image = image or DEFAULT_IMAGE

    def unavailable(self) -> str | None:
        for tool, package in (
            ("qemu-system-x86_64", "qemu-system-x86"),
            (VIRTIOFSD, "qemu-system-common"),
            ("unshare", "util-linux"),
        ):
            if shutil.which(tool) is None:
                return f"{tool} is not installed (Debian package {package})"
        if os.geteuid() != 0:
            return "virtiofsd needs root to serve the guest's read-only share"
        for part in ("vmlinux", "initramfs.cpio.gz"):
            if not (self.image / part).exists():
                return f"no VM image at {self.image}: run `lantern runtime build-image`"
        return None

    def accel(self) -> list[str]:
        if standard_kvm():
            return ["-accel", "kvm", "-cpu", "host"]
        return ["-accel", "tcg", "-cpu", "max"]

    def stage(self, spec: VmSpec, root: Path) -> list[str]:
        """The guest's root as mount points, and the shell lines that bind the shares onto
        them read-only (run in the private mount namespace of virtiofsd)."""
        for point in ("proc", "dev", "tmp", "etc", "opt"):
            (root / point).mkdir(parents=True, exist_ok=True)
        # The top first: a bind of it made after the shares' would hide them.
        top = shlex.quote(str(root))
        lines = [f"mount --bind {top} {top} && mount -o remount,bind,ro {top}"]
        for share in shares(spec.app_dir):
            target = root / share.guest.lstrip("/")
            if os.path.isdir(share.host):
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.touch()
            src, dst = shlex.quote(share.host), shlex.quote(str(target))
            lines.append(f"mount --bind {src} {dst} && mount -o remount,bind,ro {dst}")
        for link, to in usr_links().items():
            path = root / link.lstrip("/")
            if not path.is_symlink():
                path.symlink_to(to)
        env = guest_env(spec, "")
        env.pop("LANTERN_CHANNEL")  # the init finds the port and names it
        (root / "lantern.env").write_text(" ".join(f"{k}={v}" for k, v in env.items()) + "\n")
        (root / "lantern-boot.py").write_text(BOOT)
        return lines

    async def start(self, spec: VmSpec) -> QemuVm:
        reason = self.unavailable()
        if reason is not None:
            raise DriverUnavailable(reason)
        files = spec.files()
        root = files / "root"
        binds = self.stage(spec, root)
        fs_sock, ch_sock = files / "fs.sock", files / "ch.sock"
        for sock in (fs_sock, ch_sock):
            sock.unlink(missing_ok=True)
        log_path = files / "console.log"
        fs_cmd = " && ".join(
            [*binds, f"exec {VIRTIOFSD} --socket-path={shlex.quote(str(fs_sock))}"
             f" -o source={shlex.quote(str(root))} -o cache=always -o sandbox=chroot"]
        )  # fmt: skip
        connected: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
        connected = asyncio.get_running_loop().create_future()

        def on_connect(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            if not connected.done():
                connected.set_result((r, w))
            else:
                w.close()

        server = await asyncio.start_unix_server(on_connect, str(ch_sock), limit=16 * 1024 * 1024)
        with log_file(files / "virtiofsd.log") as log:
            fs = await asyncio.create_subprocess_exec(
                "unshare", "--mount", "--propagation", "private", "sh", "-c", fs_cmd,
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True,
                preexec_fn=die_with_node,
            )  # fmt: skip
            for _ in range(200):  # virtiofsd makes its socket once the binds are done
                if fs_sock.exists() or fs.returncode is not None:
                    break
                await asyncio.sleep(0.02)
            if not fs_sock.exists():
                server.close()
                fs.kill()
                raise DriverUnavailable(
                    "virtiofsd did not start (see virtiofsd.log in the VM folder)"
                )
            khz = host_khz()
            # cryptomgr.notests: the self-tests of the kernel's crypto algorithms took a second
            # of every emulated boot, for a guest whose kernel encrypts nothing.
            cmdline = [
                "console=ttyS0", "quiet", "panic=-1", "tsc=reliable", "cryptomgr.notests",
                *([f"tsc_early_khz={khz}"] if khz else []),
                f"LANTERN_PYTHON={python_binary()}",
            ]  # fmt: skip
            mem = f"{spec.memory_mb}M"
            qemu = await asyncio.create_subprocess_exec(
                "qemu-system-x86_64",
                # An RTC: without one the guest's clock starts in 1970, and its kernel spends over a
                # second of emulated time failing to read it (twice) at every boot.
                "-M", "microvm,x-option-roms=off,rtc=on,isa-serial=on",
                "-global", "virtio-mmio.force-legacy=false",
                *self.accel(),
                "-m", mem, "-smp", str(spec.vcpus),
                "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
                "-kernel", str(self.image / "vmlinux"),
                "-initrd", str(self.image / "initramfs.cpio.gz"),
                "-append", " ".join(cmdline),
                "-serial", "stdio",
                "-object", f"memory-backend-memfd,id=mem,size={mem},share=on",
                "-numa", "node,memdev=mem",
                "-chardev", f"socket,id=fs,path={fs_sock}",
                "-device", "vhost-user-fs-device,chardev=fs,tag=host",
                "-device", "virtio-serial-device",
                "-chardev", f"socket,id=ch,path={ch_sock}",
                "-device", "virtserialport,chardev=ch,name=lantern",
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_node,
            )  # fmt: skip
        console = ConsoleLog(log_path, spec.log_bytes)
        try:
            reader, writer = await asyncio.wait_for(connected, 30)
        except TimeoutError:
            qemu.kill()
            fs.kill()
            server.close()
            await console.follow(qemu.stdout)
            raise DriverUnavailable("QEMU did not open the VM's channel") from None
        return QemuVm(qemu, fs, reader, writer, console, server)
