from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lantern.runtime.drivers import DRIVERS, Driver
from tests.conftest import sqlite_url
from tests.runtime.cluster import Cluster


def working(name: str) -> Driver:
    """The driver, or a failure (under CI) / skip saying why this host lacks it."""
    import os

    driver = DRIVERS[name]
    why = driver.unavailable()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"driver {name} cannot run here: {why}")
        pytest.skip(f"driver {name} cannot run here: {why}")
    return driver


@pytest.fixture(params=["gvisor", "sandbox"])
def driver(request: pytest.FixtureRequest) -> Driver:
    """The drivers quick enough to boot once per test (qemu boots once, in its own test)."""
    return working(request.param)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A control plane and one sandbox runtime node on a fresh SQLite database."""
    working("sandbox")
    found = Cluster(sqlite_url(tmp_path), tmp_path).serve()
    try:
        yield found
    finally:
        found.close()
