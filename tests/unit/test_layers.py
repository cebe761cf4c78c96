"""The layers contract of `make lint` fails the build on an upward import, a type-only one too."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "lantern", tree / "lantern", ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


def test_the_tree_keeps_its_layers(tmp_path: Path) -> None:
    result = lint(copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_type_only_upward_import_breaks_the_build(tmp_path: Path) -> None:
    tree = copy(tmp_path)
    metrics = tree / "lantern" / "observability" / "metrics.py"
    metrics.write_text(
        metrics.read_text()
        + "\n\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        + "    from lantern.engine.runner import Runner  # noqa: F401\n"
    )
    result = lint(tree)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
    assert "lantern.observability.metrics -> lantern.engine.runner" in result.stdout


def test_a_drive_importing_the_runner_breaks_the_build(tmp_path: Path) -> None:
    tree = copy(tmp_path)
    drive = tree / "lantern" / "engine" / "drive.py"
    drive.write_text(drive.read_text() + "\n\nfrom lantern.engine import runner  # noqa: E402\n")
    result = lint(tree)
    assert result.returncode != 0
    assert "lantern.engine.drive -> lantern.engine.runner" in result.stdout


def test_a_package_outside_the_layers_breaks_the_build(tmp_path: Path) -> None:
    """The layers contract is exhaustive: a new package of lantern/ must be given its place."""
    tree = copy(tmp_path)
    (tree / "lantern" / "newcomer").mkdir()
    (tree / "lantern" / "newcomer" / "__init__.py").write_text("")
    result = lint(tree)
    assert result.returncode != 0
    assert "lantern.newcomer" in result.stdout


def test_the_demo_importing_the_cli_breaks_the_build(tmp_path: Path) -> None:
    tree = copy(tmp_path)
    story = tree / "lantern" / "demo" / "story.py"
    story.write_text(story.read_text() + "\n\nfrom lantern.cli import common  # noqa: E402\n")
    result = lint(tree)
    assert result.returncode != 0
    assert "lantern.demo.story -> lantern.cli.common" in result.stdout
