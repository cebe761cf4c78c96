"""A workload that tries to get out of its VM and says what it managed."""

import os
import socket


def _try(fn):
    try:
        return {"ok": True, "value": fn()}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def _read(path):
    with open(path) as f:
        return f.read()


def _write_app():
    with open("/app/written-by-vm", "w") as f:
        f.write("x")
    return "written"


def _connect(port):
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        return s.recv(16).decode()


def _processes(marker):
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(pid)
            except OSError:
                pass
    return found


async def escape(ctx, host_files, port, marker, env_name):
    return {
        "read": [_try(lambda p=p: _read(p)) for p in host_files],
        "root": _try(lambda: os.listdir("/root")),
        "write_app": _try(_write_app),
        "connect": _try(lambda: _connect(port)),
        "processes": _processes(marker),
        "env": os.environ.get(env_name),
        "app": _try(lambda: sorted(os.listdir("/app"))),
        "uid": os.getuid(),
        "kernel": f"{os.uname().sysname} {os.uname().release}",
    }
