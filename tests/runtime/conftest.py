from __future__ import annotations

import pytest

from lantern.runtime.drivers import DRIVERS, Driver


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
