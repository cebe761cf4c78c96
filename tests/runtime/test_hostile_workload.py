"""A hostile workload on a runtime node that runs as root (as in a container, and as CI runs):
under every driver that works on this host it has no capability, runs as an unprivileged user
with no new privileges and a seccomp filter, cannot remount its read-only shares writable and
writes nothing into the host's /usr, the lantern package, the virtualenv or the app folder.

The microVM tier is one kind of run; graph, plain and code-first runs execute in the server
itself and run no tenant code outside a tool the operator installed (docs/security.md)."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from lantern.runtime.drivers import Driver
from lantern.runtime.drivers.base import GUEST_APP, GUEST_SITE, GUEST_SRC, python_home, shares
from tests.runtime.vms import APPS, run_workload

pytestmark = pytest.mark.timeout(120)


def test_a_workload_cannot_get_root_on_its_host(driver: Driver, tmp_path: Path) -> None:
    """qemu's is tried in its isolation test (tests/runtime/test_drivers.py), in the one VM it
    boots there."""
    attack, on_host = hostile_input()
    try:
        seen = asyncio.run(run_workload(driver, "hostile:attack", attack, workdir=tmp_path))
        assert "done" in seen, f"exit {seen['exit']}: {seen['log'][-3000:]}"
    finally:
        written = cleaned(on_host)
    assert_not_root(driver, seen["done"]["output"], written)


def hostile_input() -> tuple[dict[str, Any], list[Path]]:
    """The attack's input (a share's mount point -> a folder inside it to write to, in the
    guest) and the files it would write, on the host."""
    name = f"hostile-{uuid.uuid4().hex[:12]}"
    by_guest = {s.guest: s.host for s in shares(APPS)}
    folders = {
        "/usr": "/usr/lib",
        python_home(): os.path.join(python_home(), "lib"),
        f"{GUEST_SRC}/lantern": f"{GUEST_SRC}/lantern",
        GUEST_APP: GUEST_APP,
    }
    if GUEST_SITE in by_guest:
        folders[GUEST_SITE] = GUEST_SITE
    on_host = [
        Path(by_guest[share]) / Path(folder).relative_to(share) / name
        for share, folder in folders.items()
    ]
    return {"targets": folders, "name": name}, on_host


def cleaned(on_host: list[Path]) -> list[str]:
    """Which of the files the attack aimed at exist on the host (removed now)."""
    written = [str(p) for p in on_host if p.exists()]
    for path in on_host:
        path.unlink(missing_ok=True)
    return written


def assert_not_root(driver: Driver, found: dict[str, Any], written: list[str]) -> None:
    assert written == [], f"the workload wrote into the host: {written}"
    assert int(found["capEff"], 16) == 0, found
    assert found["uid"] != 0 and found["gid"] != 0, found
    assert all(not r["ok"] for r in found["remount"].values()), found["remount"]
    assert all(not r["ok"] for r in found["write"].values()), found["write"]
    if driver.name != "gvisor":  # gVisor's own kernel keeps these to itself
        assert found["noNewPrivs"] == "1", found
    if driver.name == "sandbox":  # a VM's kernel is its own: no filter needed in front of it
        assert found["seccomp"] == "2", found  # a filter is loaded
        assert not found["unshare"]["ok"], found  # no namespace of its own to be root in
