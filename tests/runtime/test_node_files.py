"""What a runtime node keeps on its host and shares with its VMs: never its own data folder,
database or keys; a console log that a flooding workload cannot grow past its cap; no VM
folder left behind a VM that ended well. (Graph, plain and code-first runs have no VM: their
steps' output is limited by LANTERN_MAX_OUTPUT_BYTES instead.)"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from lantern.runtime.bytecode import cache_dir
from lantern.runtime.drivers import Driver
from tests.conftest import sqlite_url
from tests.runtime.cluster import Cluster
from tests.runtime.conftest import working
from tests.runtime.vms import APPS, run_workload
from tests.server import LANTERN, ROOT

pytestmark = pytest.mark.timeout(120)


def node(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "LANTERN_URL": "http://127.0.0.1:9", "PYTHONPATH": str(ROOT)}
    full.pop("LANTERN_DATABASE_URL", None)
    full.pop("LANTERN_DATA_DIR", None)
    full.update(env)
    argv = [LANTERN, "node", "--driver", "sandbox", *args]
    return subprocess.run(argv, cwd=cwd, env=full, capture_output=True, text=True, timeout=60)


def test_a_node_never_shares_its_data_folder(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".lantern").mkdir(parents=True)
    (project / ".lantern" / "secrets.key").write_text("key")
    (project / "app").mkdir()
    # Started in the project folder, as a new user would: the database and keys in .lantern/.
    done = node(project, "--app", ".")
    assert done.returncode == 2, done
    [line] = done.stderr.strip().splitlines()
    assert "holds the node's own" in line and ".lantern" in line, line
    # The database file alone (LANTERN_DATA_DIR and the key files: tests/unit/test_appdir.py).
    db = f"sqlite:///{project / 'app' / 'lantern.db'}"
    done = node(tmp_path, "--app", str(project / "app"), LANTERN_DATABASE_URL=db)
    assert done.returncode == 2 and "holds the node's own" in done.stderr, done
    # --app is required: no folder is shared by default.
    done = node(project)
    assert done.returncode == 2 and "--app" in done.stderr, done


def test_a_flooded_console_log_keeps_its_tail_under_the_cap(driver: Driver, tmp_path: Path) -> None:
    cap = 256 * 1024
    seen = asyncio.run(
        run_workload(
            driver, "hostile:noisy", {"megabytes": 4, "last": "the-last-line"},
            workdir=tmp_path, log_bytes=cap,
        )
    )  # fmt: skip
    assert seen.get("done", {}).get("output") == "flooded", seen["log"][-2000:]
    logs = sorted(tmp_path.glob("console.log*"))
    assert sum(p.stat().st_size for p in logs) <= cap, [(p, p.stat().st_size) for p in logs]
    assert "the-last-line" in seen["log"]


def test_a_vm_folder_goes_when_its_vm_ends_well(cluster: Cluster) -> None:
    cluster.node("n1")
    cluster.agent("job", "jobs:three")
    cluster.agent("bad", "jobs:fails")
    good, bad = cluster.start_run("job", {}), cluster.start_run("bad", {})
    assert cluster.finished(good)["status"] == "succeeded"
    assert cluster.finished(bad)["status"] == "failed"
    vms = Path(tempfile.gettempdir()) / "lantern-vms"
    [good_vm], [bad_vm] = cluster.vms(good), cluster.vms(bad)

    def cleared() -> bool:
        """the VM folders are cleared"""
        kept = vms / bad_vm["vmId"]
        return (
            not (vms / good_vm["vmId"]).exists()
            and kept.exists()
            and all(p.name.startswith("console.log") for p in kept.iterdir())
        )

    cluster.wait_for(cleared, 15)


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in folder.rglob("*")
    }


def test_a_vm_cannot_read_the_data_folder_of_a_node_started_in_the_project_folder(
    tmp_path: Path,
) -> None:
    """The usual layout: a project folder holding .lantern/ (the database, the secrets key, the
    receipt signing key) and the app folder, the node started there with --app app, as root.
    A VM under each driver tries the data folder's host paths, the path beside /app and every
    /proc/PID/cwd and /proc/PID/root (qemu's VM tries the same from the test's own folder:
    test_drivers.py). The node writes nothing into the app folder either: the VMs' bytecode
    goes to a cache of the node's own (PYTHONPYCACHEPREFIX), not into it as __pycache__."""
    drivers = [working(name).name for name in ("sandbox", "gvisor")]
    project = tmp_path / "project"
    data = project / ".lantern"
    data.mkdir(parents=True)
    for name in ("secrets.key", "signing-keys.pem", "lantern.db"):
        (data / name).write_text(f"the node's {name}")
    app = project / "app"
    shutil.copytree(APPS, app, ignore=shutil.ignore_patterns("__pycache__"))
    before = _tree(app)
    cluster = Cluster(sqlite_url(tmp_path), tmp_path).serve()
    try:
        for name in drivers:
            cluster.node(name, driver=name, app_dir=Path("app"), cwd=project)
        secret = str(data / "secrets.key")
        paths = [
            *(str(p) for p in sorted(data.iterdir())),
            "/app/../.lantern/secrets.key",
            "/.lantern/secrets.key",
        ]
        peek = {"paths": paths, "relative": ".lantern/secrets.key", "absolute": secret}
        runs = {}
        for name in drivers:
            cluster.agent(f"peek-{name}", "isolation:peek", driver=name)
            runs[name] = cluster.start_run(f"peek-{name}", peek)
        for name, run_id in runs.items():
            run = cluster.finished(run_id)
            assert run["status"] == "succeeded", (name, run)
            seen = run["output"]
            assert [p for p, r in seen["read"].items() if r["ok"]] == [], (name, seen)
            assert seen["proc"] == [], (name, seen)
            assert ".lantern" not in seen["top"]["value"], (name, seen)
        assert _tree(app) == before
        cache = cache_dir(app)
        assert cache is not None and list(cache.glob("app/isolation.*.pyc")), cache
    finally:
        cluster.close()
