"""Which provider serves a model name, and the process's providers and routes.

``offline/...`` is the offline provider; ``openai/NAME`` and ``anthropic/NAME`` pick a
provider explicitly; a bare ``claude-...`` goes to Anthropic; any other name goes to the
OpenAI chat-completions API, which is also what OpenAI-compatible servers speak (so
``OPENAI_BASE_URL`` plus a local model name just works).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType

from lantern.config import ModelSettings
from lantern.errors import UsageError
from lantern.models import budget, offline, pricing, router
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


def model_problem(model: str, routes: router.Routes | None) -> str | None:
    """Why a model or route name cannot work, where that is known before a call. Without
    ``routes`` a route's name is not checked (the call then says whether it is known)."""
    if routes is None and model.startswith(router.PREFIX):
        return None
    try:
        names = router.candidates(model, routes or {})
    except UsageError as exc:
        return str(exc)
    for name in names:
        if name.startswith(offline.PREFIX) and name not in offline.MODELS:
            return f"unknown offline model {name!r} (offline models: {', '.join(offline.MODELS)})"
        if not wire_model(name):
            return f"model name {name!r} names no model"
    return None


class Models:
    """A process's model configuration: its providers (each holding one SDK client, made on
    first use), model routes, price table and workspace budgets. Built from the settings
    where a process starts (``from_settings``) and handed to whoever runs model steps."""

    def __init__(
        self,
        routes: router.Routes | None = None,
        providers: Mapping[str, Provider] | None = None,
        *,
        prices: pricing.Prices | None = None,
        workspace_budgets: Mapping[str, budget.Budget] | None = None,
    ) -> None:
        self.routes: router.Routes = MappingProxyType(dict(routes or {}))
        self.prices = prices or pricing.shipped()
        self.workspace_budgets: Mapping[str, budget.Budget] = MappingProxyType(
            dict(workspace_budgets or {})
        )
        self._providers = dict(providers or {})
        self._making = asyncio.Lock()

    @classmethod
    def from_settings(
        cls, settings: ModelSettings, providers: Mapping[str, Provider] | None = None
    ) -> Models:
        """Parse the configured routes, prices and budgets: UsageError for a broken one (a
        server checks at start, rather than failing model steps later)."""
        return cls(
            router.configured(settings.routes, settings.routes_file),
            providers,
            prices=pricing.Prices.load(settings.prices_file, settings.unknown_price),
            workspace_budgets=budget.workspace_budgets(settings.workspace_budgets),
        )

    async def aclose(self) -> None:
        for provider in self._providers.values():
            await provider.aclose()

    def provider(self, model: str) -> Provider:
        name = provider_name(model)
        found = self._providers.get(name)
        if found is None:
            found = self._providers[name] = _make(name)
        return found

    async def provider_for(self, model: str) -> Provider:
        """``provider(model)``, made off the event loop the first time: importing a provider's
        SDK takes one to several seconds, which every other run on the loop would wait out."""
        name = provider_name(model)
        found = self._providers.get(name)
        if found is not None:
            return found
        async with self._making:
            found = self._providers.get(name)
            if found is None:
                made = _make(name) if name == "offline" else await asyncio.to_thread(_make, name)
                found = self._providers[name] = made
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
