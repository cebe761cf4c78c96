"""What a VM may run: only the functions its app registers, with ``@app.agent`` or
``app.entrypoint(fn)`` (``lantern.workload.entrypoint(fn)`` for an app that imports nothing
else of Lantern).

An agent definition names its entrypoint as ``MODULE:FUNCTION``, and whoever may apply agents
in a workspace writes it; the app folder is the operator's. Without this, a definition could
name any importable callable (``os:system``, ``subprocess:run``) and have a VM call it with the
run's input. The harness imports the module, then runs the function only if the import
registered it, and only for a workspace it was registered for (``workspaces=``). Standard
library only, like the rest of ``lantern.workload``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

F = TypeVar("F", bound=Callable[..., Any])

# A registered function -> the workspaces it serves (None: every workspace).
_registered: dict[Callable[..., Any], frozenset[str] | None] = {}


@overload
def entrypoint(fn: F, *, workspaces: Iterable[str] | None = None) -> F: ...
@overload
def entrypoint(fn: None = None, *, workspaces: Iterable[str] | None = None) -> Callable[[F], F]: ...
def entrypoint(fn: F | None = None, *, workspaces: Iterable[str] | None = None) -> Any:
    """Register ``fn`` as a microVM entrypoint (``@entrypoint``, ``@entrypoint(workspaces=
    [...])`` or ``entrypoint(fn)``); with ``workspaces``, only runs of those workspaces may
    run it."""
    if isinstance(workspaces, str):
        raise TypeError("workspaces is a list of workspace names, not a string")
    only = None if workspaces is None else frozenset(workspaces)

    def register(f: F) -> F:
        if not callable(f):
            raise TypeError(f"an entrypoint is a function, not {f!r}")
        _registered[f] = only
        return f

    return register if fn is None else register(fn)


def allowed(fn: Callable[..., Any], workspace: str | None) -> bool:
    """Whether the app registered ``fn`` for ``workspace``."""
    if fn not in _registered:
        return False
    only = _registered[fn]
    return only is None or workspace in only
