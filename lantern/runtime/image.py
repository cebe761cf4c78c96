"""``lantern runtime build-image``: the kernel and initramfs the ``qemu`` driver boots.

Both come from the host's own Debian packages (``linux-image-cloud-amd64`` and
``busybox-static``); nothing is downloaded, and nothing binary is kept in the repository:

- ``vmlinux``: the uncompressed kernel, cut out of ``/boot/vmlinuz-*-cloud-amd64`` (its payload
  is LZ4; Debian's ``lz4`` tool decompresses it), because QEMU's ``microvm`` machine boots an
  ELF kernel straight through its PVH entry, without a firmware decompressing a bzImage under
  software emulation;
- ``initramfs.cpio.gz``: busybox, the modules a guest needs (virtio over MMIO, the virtio
  console, FUSE and virtiofs) and :data:`INIT`, which mounts the shared root read-only, gives it
  its own ``/proc``, ``/dev`` and a ``/tmp`` in memory, runs the harness in it and powers off.
"""

from __future__ import annotations

import glob
import gzip
import io
import os
import shutil
import stat
import subprocess
from pathlib import Path

MODULES = (
    "kernel/drivers/virtio/virtio_ring.ko",
    "kernel/drivers/virtio/virtio.ko",
    "kernel/drivers/virtio/virtio_mmio.ko",
    "kernel/drivers/char/virtio_console.ko",
    "kernel/fs/fuse/fuse.ko",
    "kernel/fs/fuse/virtiofs.ko",
)
LZ4_MAGIC = b"\x02\x21\x4c\x18"

INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
hostname lantern-vm
for m in virtio_ring virtio virtio_mmio virtio_console fuse virtiofs; do
    insmod /lib/modules/$m.ko || echo "lantern: cannot load $m"
done
mount -t virtiofs -o ro host /host || { echo "LANTERN_EXIT=97"; poweroff -f; }
mount -t proc proc /host/proc
mount -t devtmpfs dev /host/dev
mount -t tmpfs -o mode=1777,size=64m tmp /host/tmp
channel=""
for i in 1 2 3 4 5 6 7 8 9 10; do
    for d in /dev/vport*p1; do [ -e "$d" ] && channel="$d"; done
    [ -n "$channel" ] && break
    sleep 0.1
done
# -S: no site module. The guest's sys.path is PYTHONPATH (the driver's), and the host
# installation's .pth hooks, which may import half the standard library, stay out of every boot.
# The workload runs as nobody with no capability and no new privileges, as under every driver:
# the VM's root could otherwise remount what it sees or load kernel modules. Its channel is
# the one device it may open.
[ -n "$channel" ] && chmod 666 "$channel"
chroot /host /usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups \\
    --inh-caps=-all --bounding-set=-all --no-new-privs \\
    /usr/bin/env -i $(cat /host/lantern.env) LANTERN_CHANNEL=$channel \\
    "$LANTERN_PYTHON" -S /lantern-boot.py
echo "LANTERN_EXIT=$?"
poweroff -f
"""


class ImageError(Exception):
    """The host lacks what the image is built from; the message says which package."""


def kernel_release() -> str:
    found = sorted(glob.glob("/boot/vmlinuz-*-cloud-amd64"))
    if not found:
        raise ImageError("no /boot/vmlinuz-*-cloud-amd64: install linux-image-cloud-amd64")
    return Path(found[-1]).name.removeprefix("vmlinuz-")


def extract_vmlinux(bzimage: bytes) -> bytes:
    """The ELF kernel inside a bzImage whose payload is LZ4 (as Debian's cloud kernel's is)."""
    if shutil.which("lz4") is None:
        raise ImageError("lz4 is not installed (Debian package lz4)")
    at = bzimage.find(LZ4_MAGIC)
    while at != -1:
        out = subprocess.run(["lz4", "-dc"], input=bzimage[at:], capture_output=True).stdout
        if out[:4] == b"\x7fELF":
            return out
        at = bzimage.find(LZ4_MAGIC, at + 1)
    raise ImageError("no LZ4-compressed ELF kernel found in the bzImage")


def _cpio(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of (path, mode, content) entries, directories first."""
    out = io.BytesIO()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        encoded = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        out.write(header + encoded)
        out.write(b"\0" * (-(len(header) + len(encoded)) % 4))
        out.write(data)
        out.write(b"\0" * (-len(data) % 4))
    return out.getvalue()


def build(out: Path) -> tuple[Path, Path]:
    """Write ``vmlinux`` and ``initramfs.cpio.gz`` under ``out``."""
    busybox = "/bin/busybox"
    if not os.path.exists(busybox):
        raise ImageError("/bin/busybox is missing (Debian package busybox-static)")
    release = kernel_release()
    modules = Path("/lib/modules") / release
    out.mkdir(parents=True, exist_ok=True)
    vmlinux = out / "vmlinux"
    vmlinux.write_bytes(extract_vmlinux(Path(f"/boot/vmlinuz-{release}").read_bytes()))
    d, x, f = stat.S_IFDIR | 0o755, stat.S_IFREG | 0o755, stat.S_IFREG | 0o644
    entries = [(p, d, b"") for p in ("bin", "dev", "proc", "sys", "host", "lib", "lib/modules")]
    entries.append(("bin/busybox", x, Path(busybox).read_bytes()))
    entries.append(("init", x, INIT.encode()))
    for module in MODULES:
        path = modules / module
        if not path.exists():
            raise ImageError(f"kernel module {path} is missing")
        entries.append((f"lib/modules/{path.name}", f, path.read_bytes()))
    initramfs = out / "initramfs.cpio.gz"
    initramfs.write_bytes(gzip.compress(_cpio(entries), compresslevel=6))
    (out / "release").write_text(release + "\n")
    return vmlinux, initramfs
