"""The installed distribution, as a newcomer's pip sees it: named lantern-durable (the name
`lantern` on PyPI is another project's), providing `import lantern` and the `lantern` command,
its license an SPDX expression (no setuptools warning about a license table) matching the
LICENSE file it ships, and the README saying how to install it."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import lantern

ROOT = Path(__file__).resolve().parents[2]


def test_the_distribution_is_lantern_durable_with_an_spdx_license() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "lantern-durable"
    assert project["license"] == "Apache-2.0"  # a string, not the deprecated table
    meta = importlib.metadata.metadata("lantern-durable")
    assert meta["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in (meta.get_all("License-File") or [])
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert "Version 2.0" in (ROOT / "LICENSE").read_text()[:200]
    entry = importlib.metadata.entry_points(group="console_scripts", name="lantern")
    assert [e.value for e in entry] == ["lantern.cli.main:main"]
    assert Path(lantern.__file__).parent == ROOT / "lantern"


def test_the_readme_says_how_to_install_it() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "python -m pip install /path/to/lantern" in readme
    assert "The distribution is named `lantern-durable`" in readme
    assert "`pip install lantern` does not get you this" in readme
