"""What a model call costs, from the price table in ``prices.json`` (package data).

Prices are USD per million input and output tokens. A model the table does not know costs
nothing on paper: its tokens are still counted and its usage says ``priced: false``.
``LANTERN_MODEL_PRICES=FILE`` adds or overrides entries without a release.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from lantern.errors import UsageError
from lantern.models.offline import PREFIX as OFFLINE
from lantern.models.records import TokenUsage

log = logging.getLogger("lantern.models.pricing")


@dataclass(frozen=True)
class Price:
    input: float  # USD per million tokens
    output: float

    def cost(self, usage: TokenUsage) -> float:
        return (usage.input_tokens * self.input + usage.output_tokens * self.output) / 1_000_000


FREE = Price(0.0, 0.0)


def _entries(raw: Any, where: str) -> dict[str, Price]:
    models = raw.get("models") if isinstance(raw, dict) else None
    if not isinstance(models, dict):
        raise UsageError(f'{where}: expected {{"models": {{NAME: {{input, output}}}}}}')
    out = {}
    for name, p in models.items():
        try:
            out[name] = Price(float(p["input"]), float(p["output"]))
        except (TypeError, KeyError, ValueError) as exc:
            raise UsageError(f"{where}: model {name!r} needs numeric input and output") from exc
    return out


@functools.cache
def builtin() -> dict[str, Price]:
    """The table shipped in ``prices.json``."""
    text = (resources.files("lantern.models") / "prices.json").read_text()
    return _entries(json.loads(text), "prices.json")


def unknown_price(raw: str | None) -> Price | None:
    """``LANTERN_UNKNOWN_MODEL_PRICE=IN,OUT`` (USD per million tokens): what a model the table
    does not know is assumed to cost. Unset: unknown, and a ``maxUsd`` budget refuses the call
    rather than count it as free."""
    raw = (raw or "").strip()
    if not raw:
        return None
    try:
        given, taken = (float(x) for x in raw.split(","))
    except ValueError:
        raise UsageError(
            f"LANTERN_UNKNOWN_MODEL_PRICE={raw!r} must be INPUT,OUTPUT in USD per million tokens"
        ) from None
    if not (given >= 0 and taken >= 0):
        raise UsageError(f"LANTERN_UNKNOWN_MODEL_PRICE={raw!r} cannot be negative")
    return Price(given, taken)


@dataclass(frozen=True)
class Prices:
    """The price table a process charges by: the shipped one, what ``LANTERN_MODEL_PRICES``
    adds or overrides, and the price assumed for a model neither lists."""

    table: Mapping[str, Price]
    unknown: Price | None = None

    @classmethod
    def load(cls, extra: str | None = None, unknown: str | None = None) -> Prices:
        """``extra``: a LANTERN_MODEL_PRICES file; ``unknown``: LANTERN_UNKNOWN_MODEL_PRICE."""
        prices = dict(builtin())
        if extra:
            try:
                raw = json.loads(Path(extra).read_text())
            except (OSError, ValueError) as exc:
                raise UsageError(f"LANTERN_MODEL_PRICES={extra!r}: {exc}") from exc
            prices.update(_entries(raw, f"LANTERN_MODEL_PRICES={extra!r}"))
        return cls(MappingProxyType(prices), unknown_price(unknown))

    def price(self, model: str) -> Price | None:
        """The model's price, None when unknown. ``provider/model`` names are looked up bare."""
        if model.startswith(OFFLINE):
            return FREE
        prices = self.table
        bare = model.split("/", 1)[1] if model.startswith(("openai/", "anthropic/")) else model
        if bare in prices:
            return prices[bare]
        # Dated snapshots (gpt-4o-2024-08-06, claude-sonnet-4-5-20250929): longest listed prefix.
        for name in sorted(prices, key=len, reverse=True):
            if bare.startswith(name + "-"):
                return prices[name]
        return self.unknown

    def cost(self, model: str, usage: TokenUsage) -> tuple[float, bool]:
        """(USD, whether the model has a price)."""
        p = self.price(model)
        if p is None:
            _warn_unpriced(model)
            return 0.0, False
        return round(p.cost(usage), 10), True


@functools.cache
def shipped() -> Prices:
    """The shipped table alone, nothing assumed for unknown models."""
    return Prices(MappingProxyType(builtin()))


def price(model: str) -> Price | None:
    """The model's price in the shipped table."""
    return shipped().price(model)


def cost(model: str, usage: TokenUsage) -> tuple[float, bool]:
    """(USD, whether the model has a price) by the shipped table."""
    return shipped().cost(model, usage)


@functools.cache
def _warn_unpriced(model: str) -> None:
    log.warning("no price known for model %r: its tokens are counted, its cost is not", model)
