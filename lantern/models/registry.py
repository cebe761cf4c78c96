"""Which provider serves a model name, and the process's providers and routes.

``offline/...`` is the offline provider; ``openai/NAME`` and ``anthropic/NAME`` pick a
provider explicitly; a bare ``claude-...`` goes to Anthropic; any other name goes to the
OpenAI chat-completions API, which is also what OpenAI-compatible servers speak (so
``OPENAI_BASE_URL`` plus a local model name just works).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

from lantern.errors import UsageError
from lantern.models import offline, router
from lantern.models.records import Provider


def provider_name(model: str) -> str:
    if model.startswith(offline.PREFIX):
        return "offline"
    if model.startswith("anthropic/") or model.startswith("claude"):
        return "anthropic"
    return "openai"


def wire_model(model: str) -> str:
    """The name the provider is sent: without an explicit ``openai/``/``anthropic/`` prefix."""
    for prefix in ("openai/", "anthropic/"):
        if model.startswith(prefix):
            return model[len(prefix) :]
    return model


def model_problem(model: str, routes: router.Routes) -> str | None:
    """Why a model or route name cannot work, where that is known before a call."""
    try:
        names = router.candidates(model, routes)
    except UsageError as exc:
        return str(exc)
    for name in names:
        if name.startswith(offline.PREFIX) and name not in offline.MODELS:
            return f"unknown offline model {name!r} (offline models: {', '.join(offline.MODELS)})"
        if not wire_model(name):
            return f"model name {name!r} names no model"
    return None


class Models:
    """The process's providers (each holding one SDK client) and model routes."""

    def __init__(
        self,
        routes: router.Routes | None = None,
        providers: Mapping[str, Provider] | None = None,
    ) -> None:
        self._fixed = routes
        self._providers = dict(providers or {})
        self._env: tuple[str | None, str | None] | None = None
        self._from_env: router.Routes = {}

    @property
    def routes(self) -> router.Routes:
        """The routes given, or those configured in the environment (read again on change)."""
        if self._fixed is not None:
            return self._fixed
        env = (os.environ.get("LANTERN_MODEL_ROUTES"), os.environ.get("LANTERN_MODEL_ROUTES_FILE"))
        if env != self._env:
            self._from_env = router.routes_from_env()
            self._env = env
        return self._from_env

    async def aclose(self) -> None:
        for provider in self._providers.values():
            await provider.aclose()

    def provider(self, model: str) -> Provider:
        name = provider_name(model)
        found = self._providers.get(name)
        if found is None:
            found = self._providers[name] = _make(name)
        return found


def _make(name: str) -> Provider:
    # Imported here: a process that only uses offline models never loads the SDKs.
    if name == "offline":
        return offline.OfflineProvider()
    if name == "anthropic":
        from lantern.models.anthropic import AnthropicProvider

        return AnthropicProvider()
    from lantern.models.openai import OpenAIProvider

    return OpenAIProvider()


def check_configuration() -> None:
    """Raise UsageError now for a broken route, price or budget setting (a server checks at
    start, rather than failing model steps later)."""
    from lantern.models import budget, pricing

    router.routes_from_env()
    pricing.table()
    budget.workspace_budgets()


@functools.cache
def default() -> Models:
    """The providers of this process: one per provider, SDK clients shared by every run."""
    return Models()
