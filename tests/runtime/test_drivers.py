"""Each driver boots a VM whose only way out is its channel (real VMs, no stand-ins)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from lantern.cli.runtime import auto_choice
from lantern.runtime.drivers import DRIVERS, Check, Driver, VmSpec, probe
from lantern.runtime.drivers.base import GUEST_SRC
from lantern.runtime.drivers.sandbox import SandboxDriver
from tests.runtime.conftest import working
from tests.runtime.test_hostile_workload import assert_not_root, cleaned, hostile_input
from tests.runtime.vms import APPS, run_workload

pytestmark = pytest.mark.timeout(300)


def test_boot(driver: Driver, tmp_path: Path) -> None:
    check = asyncio.run(probe(driver, tmp_path))
    assert check.works, check.why
    if driver.name == "gvisor":
        assert "4.4.0" in check.why  # gVisor's own kernel answers uname, not the host's


def test_isolation(driver: Driver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_isolation(driver, tmp_path, monkeypatch)


def test_qemu_boots_a_vm_that_is_isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One boot of a real VM (software emulation where no standard KVM is usable)."""
    from lantern.runtime.drivers.qemu import QemuDriver
    from lantern.runtime.image import build

    if "qemu" not in DRIVERS or shutil.which("qemu-system-x86_64") is None:
        working("qemu")
    build(tmp_path / "image")
    driver = QemuDriver(tmp_path / "image")
    assert driver.unavailable() is None, driver.unavailable()
    result = check_isolation(driver, tmp_path / "vm", monkeypatch, hostile=True)
    assert result["kernel"].startswith("Linux 6.")  # the image's own kernel


def check_isolation(
    driver: Driver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, hostile: bool = False
) -> dict[str, Any]:
    """``hostile``: the same VM tries to get root on its host as well (test_hostile_workload)."""
    attack, on_host = hostile_input() if hostile else (None, [])
    # Under the checkout, not shared; one per test, as xdist runs drivers' tests side by side.
    secret_file = Path.cwd() / f".pytest-isolation-secret-{uuid.uuid4().hex[:12]}"
    secret_file.write_text("host secret")
    monkeypatch.setenv("LANTERN_TEST_HOST_SECRET", "do-not-leak")
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted: list[socket.socket] = []

    def accept() -> None:
        server.settimeout(20)
        try:
            conn, _ = server.accept()
            accepted.append(conn)
            conn.sendall(b"hello")
        except OSError:
            pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        seen = asyncio.run(
            run_workload(
                driver,
                "isolation:escape",
                {
                    "host_files": [str(secret_file), f"{GUEST_SRC}/{secret_file.name}"],
                    "port": port,
                    "marker": "pytest",
                    "env_name": "LANTERN_TEST_HOST_SECRET",
                    "attack": attack,
                },
                workdir=tmp_path,
            )
        )
    finally:
        server.close()
        secret_file.unlink()
        written = cleaned(on_host)
    assert "done" in seen, f"exit {seen['exit']}: {seen['log'][-3000:]}"
    result: dict[str, Any] = seen["done"]["output"]
    if hostile:
        assert_not_root(driver, result["attack"], written)
    assert [r["ok"] for r in result["read"]] == [False, False], result
    assert result["proc"] == [], result  # nor through the node's (the test's) own /proc/PID/cwd
    assert result["root"]["ok"] is False or result["root"]["value"] in ([], [".pyenv"]), result
    # Refused by the read-only share, or before it by the folder's mode (the workload is nobody).
    error = result["write_app"].get("error", "")
    assert not result["write_app"]["ok"] and ("Read-only" in error or "Permission" in error)
    assert not (APPS / "written-by-vm").exists()
    assert result["connect"]["ok"] is False, result
    assert accepted == []
    assert result["processes"] == []  # the test runner's own processes are invisible
    assert result["env"] is None
    assert "isolation.py" in result["app"]["value"]  # what is shared is there, read-only
    return result


def test_entrypoint_that_does_not_import(driver: Driver, tmp_path: Path) -> None:
    seen = asyncio.run(run_workload(driver, "no_such_module:main", {}, workdir=tmp_path))
    assert seen["failed"]["error"]["code"] == "entrypoint_import"
    assert "no_such_module" in seen["failed"]["error"]["message"]


class RootSandbox(SandboxDriver):
    """bubblewrap as the sandbox driver ran it before it dropped root's uid and capabilities:
    what a host that cannot drop them would run."""

    def argv(self, spec: VmSpec, seccomp_fd: int) -> list[str]:
        args = super().argv(spec, seccomp_fd)
        for option, values in (("--unshare-user", 0), ("--uid", 1), ("--gid", 1),
                               ("--cap-drop", 1), ("--disable-userns", 0)):  # fmt: skip
            at = args.index(option)
            del args[at : at + 1 + values]
        return args


def test_a_driver_whose_workloads_keep_root_is_refused(tmp_path: Path) -> None:
    working("sandbox")
    if os.geteuid() != 0:
        pytest.skip("only root's workloads keep root's capabilities")
    check = asyncio.run(probe(RootSandbox(), tmp_path))
    assert not check.works
    assert check.why.startswith("refused: its workloads would run privileged (uid 0"), check.why
    assert auto_choice([check]) == "auto: none (no driver works on this host)"
    works = Check("gvisor", "", True, "booted", 1.0)
    assert auto_choice([check, works]) == "auto: gvisor"
    assert auto_choice([works, check]) == "auto: gvisor"
