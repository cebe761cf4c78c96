"""``--app MODULE:OBJECT`` and ``--app-dir DIR``: finding the user's App as uvicorn finds its app.

The app directory (default: the current one) goes first on ``sys.path``, so ``--app
triage_app:app`` works from the module's own folder without ``PYTHONPATH``. A file path given
where a module belongs, a malformed name, or a module that fails while importing is one usage
line naming what to type instead, never a traceback.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

import click

from lantern.errors import UsageError

if TYPE_CHECKING:
    from lantern.app import App

APP_HELP = "Load the user's tools: a module (dotted, importable from --app-dir) and its App."
APP_DIR_HELP = "The folder --app is imported from, put first on the path (default: here)."


def app_options(fn: click.decorators.FC) -> click.decorators.FC:
    """``--app`` and ``--app-dir``, for every command that loads the user's tools."""
    fn = click.option("--app-dir", default=".", metavar="DIR", help=APP_DIR_HELP)(fn)
    return click.option("--app", "app_spec", metavar="MODULE:OBJECT", help=APP_HELP)(fn)


def load_user_app(spec: str | None, app_dir: str = ".") -> App:
    """The App ``spec`` names, imported with ``app_dir`` first on ``sys.path``."""
    from lantern.app import App, load_app

    if not spec:
        return App()
    module_name, _, attr = spec.partition(":")
    _check_module_name(spec, module_name, app_dir)
    if attr and not attr.isidentifier():
        raise UsageError(f"--app {spec!r}: {attr!r} is not a Python name (MODULE:OBJECT)")
    folder = Path(app_dir)
    if not folder.is_dir():
        raise UsageError(f"--app-dir {app_dir!r} is not a directory")
    where = str(folder.resolve())
    if where not in sys.path:
        sys.path.insert(0, where)
    try:
        importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import --app module {module_name!r} from {where}: {exc}") from exc
    except Exception as exc:  # the module itself raised: say where, in one line
        raise UsageError(
            f"--app module {module_name!r} raised while importing{_origin(exc)}:"
            f" {type(exc).__name__}: {exc}"
        ) from exc
    return load_app(spec)


def _check_module_name(spec: str, module_name: str, app_dir: str) -> None:
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        path = Path(module_name)
        folder = path.parent if app_dir == "." else Path(app_dir) / path.parent
        hint = f"--app {path.stem}:{spec.partition(':')[2] or 'app'}"
        if str(folder) != ".":
            hint += f" --app-dir {folder}"
        raise UsageError(f"--app takes a module, not a file path: {hint}")
    if not all(part.isidentifier() for part in module_name.split(".")):
        raise UsageError(f"--app {spec!r}: {module_name!r} is not a module name (MODULE:OBJECT)")


def _origin(exc: BaseException) -> str:
    """`` at FILE:LINE`` of the innermost frame the exception passed through, if any."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" at {Path(last.filename).name}:{last.lineno}"
