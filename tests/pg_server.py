"""Make sure the PostgreSQL the tests use answers (the README's Quick start).

`ensure`: if nothing answers at LANTERN_TEST_DATABASE_URL, start the machine's cluster with
its own tools, or failing that a throwaway server from the local binaries, and write the URL
the tests should use to .lantern/test-database-url.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"
URL_FILE = Path(__file__).resolve().parent.parent / ".lantern" / "test-database-url"


def answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def wait_for(url: str, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if answers(url):
            return True
        time.sleep(0.5)
    return False


def start_cluster() -> bool:
    """The Debian cluster this machine ships, started as its docs say."""
    if shutil.which("pg_ctlcluster") is None:
        return False
    versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    for version in versions:
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"],
            check=False,
            capture_output=True,
        )
    return bool(versions)


def start_throwaway() -> str | None:
    """initdb + pg_ctl in a temporary folder, owned by the postgres user when run as root."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        return None
    bindir = Path(found[-1]).parent
    data = Path(tempfile.mkdtemp(prefix="lantern-pg-"))
    prefix: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(data, "postgres")
        prefix = ["runuser", "-u", "postgres", "--"]
    port = "55432"
    subprocess.run(
        [*prefix, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            *prefix,
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            f"-p {port} -k {data} -h 127.0.0.1",
            "-l",
            str(data / "log"),
            "start",
        ],
        check=True,
        capture_output=True,
    )
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    return url if wait_for(url) else None


# The catalog tables every test's schema adds rows to and its drop leaves dead. A server run
# with autovacuum off (this machine's is) grew them by ~600 schemas a suite: 1.3 million dead
# pg_attribute rows, and each run slower than the last.
CATALOG = ("pg_attribute", "pg_class", "pg_depend", "pg_type", "pg_constraint", "pg_index")


def vacuum_catalog(url: str) -> None:
    """Reclaim the rows the tests' dropped schemas left in the catalog (a plain VACUUM: it
    takes no lock that stops other sessions)."""
    with contextlib.suppress(psycopg.Error), psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM " + ", ".join(f"pg_catalog.{t}" for t in CATALOG))


def ensure() -> int:
    url = os.environ.get("LANTERN_TEST_DATABASE_URL", DEFAULT)
    URL_FILE.parent.mkdir(parents=True, exist_ok=True)
    if answers(url) or (start_cluster() and wait_for(url)):
        vacuum_catalog(url)
        URL_FILE.write_text(url)
        return 0
    throwaway = start_throwaway()
    if throwaway is not None:
        URL_FILE.write_text(throwaway)
        print(f"started a throwaway PostgreSQL at {throwaway}")
        return 0
    URL_FILE.unlink(missing_ok=True)
    print(f"no PostgreSQL answers at {url} and none could be started", file=sys.stderr)
    return 1 if os.environ.get("CI") == "true" else 0


if __name__ == "__main__":
    sys.exit(ensure() if sys.argv[1:] == ["ensure"] else 2)


class PrivateCluster:
    """A PostgreSQL server of one test's own, to stop, restart and crash at will.

    Outage tests use it so the shared server the other tests use stays up. It lives in a
    temporary folder (owned by the postgres user when run as root) on a free port.
    """

    def __init__(self) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not found:
            raise RuntimeError("no PostgreSQL binaries (initdb) on this machine")
        self.bindir = Path(found[-1]).parent
        self.data = Path(tempfile.mkdtemp(prefix="lantern-pg-private-"))
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.data, "postgres")
            self.prefix = ["runuser", "-u", "postgres", "--"]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._pg_ctl([], pg="initdb")

    def _pg_ctl(self, args: list[str], pg: str = "pg_ctl") -> None:
        if pg == "initdb":
            initdb = str(self.bindir / "initdb")
            cmd = [initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres"]
        else:
            cmd = [str(self.bindir / "pg_ctl"), "-D", str(self.data), *args]
        done = subprocess.run([*self.prefix, *cmd], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stdout}{done.stderr}")

    def start(self) -> PrivateCluster:
        self._pg_ctl(
            [
                "-o",
                f"-p {self.port} -k {self.data} -h 127.0.0.1 -c fsync=off",
                "-l",
                str(self.data / "log"),
                "-w",
                "start",
            ]
        )
        if not wait_for(self.url):
            raise RuntimeError(f"the private PostgreSQL at {self.url} does not answer")
        return self

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl(["-m", mode, "-w", "stop"])

    def restart(self, mode: str = "immediate") -> None:
        self._pg_ctl(["-m", mode, "-w", "-l", str(self.data / "log"), "restart"])
        if not wait_for(self.url):
            raise RuntimeError(f"the private PostgreSQL at {self.url} did not come back")

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.stop("immediate")
        shutil.rmtree(self.data, ignore_errors=True)
