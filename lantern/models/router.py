"""Model routes: ``"model": "route:NAME"`` names an ordered list of models in configuration.

``LANTERN_MODEL_ROUTES`` holds a JSON object ``{"NAME": ["model", "fallback", ...]}``, or
``LANTERN_MODEL_ROUTES_FILE`` a path to one (JSON or YAML). A call tries the models in order
and moves on only when a model fails with a retryable provider error (a rate limit, a 5xx, no
answer); the model that answered is journaled in the step's output, so a replay serves it
and never routes again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from lantern.errors import UsageError

PREFIX = "route:"
Routes = Mapping[str, tuple[str, ...]]


def parse_routes(raw: Any, where: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(raw, dict):
        raise UsageError(f'{where}: expected an object {{"NAME": ["model", ...]}}')
    routes: dict[str, tuple[str, ...]] = {}
    for name, models in raw.items():
        if (
            not isinstance(models, list)
            or not models
            or not all(isinstance(m, str) and m and not m.startswith(PREFIX) for m in models)
        ):
            raise UsageError(
                f"{where}: route {name!r} must be a non-empty list of model names (not routes)"
            )
        routes[str(name)] = tuple(models)
    return routes


def configured(inline: str | None, path: str | None) -> dict[str, tuple[str, ...]]:
    """The routes LANTERN_MODEL_ROUTES (``inline``) and LANTERN_MODEL_ROUTES_FILE (``path``)
    give; the inline ones win a name both define."""
    routes: dict[str, tuple[str, ...]] = {}
    if path:
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"LANTERN_MODEL_ROUTES_FILE={path!r}: {exc}") from exc
        routes.update(parse_routes(raw, f"LANTERN_MODEL_ROUTES_FILE={path!r}"))
    if inline:
        try:
            raw = json.loads(inline)
        except ValueError as exc:
            raise UsageError(f"LANTERN_MODEL_ROUTES is not JSON: {exc}") from exc
        routes.update(parse_routes(raw, "LANTERN_MODEL_ROUTES"))
    return routes


def candidates(model: str, routes: Routes) -> tuple[str, ...]:
    """The models to try for ``model``, in order: the route's list, or the model alone."""
    if not model.startswith(PREFIX):
        return (model,)
    name = model[len(PREFIX) :]
    if name not in routes:
        known = ", ".join(sorted(routes)) or "none configured"
        raise UsageError(
            f"unknown model route {name!r} (routes: {known}; set LANTERN_MODEL_ROUTES)"
        )
    return routes[name]
