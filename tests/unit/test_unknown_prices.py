"""A model the price table does not know: a dollar budget says it cannot be kept instead of
counting the calls as free, unless the operator assumes a price for unknown models."""

from __future__ import annotations

import pytest

from lantern.config import ModelSettings
from lantern.errors import BudgetExceeded, UsageError
from lantern.models import pricing
from lantern.models.budget import Budget, Gate
from lantern.models.records import Message, ModelRequest
from lantern.models.registry import Models
from lantern.store.records import RunUsage

REQUEST = ModelRequest("mystery-model-9", (Message("user", "hello"),), "k")


def prices(env: dict[str, str]) -> pricing.Prices:
    """The price table a process started with ``env`` charges by."""
    return Models.from_settings(ModelSettings.from_env(env)).prices


async def test_a_dollar_budget_refuses_a_model_without_a_price() -> None:
    unset = prices({})
    gate = Gate(run_spent=RunUsage, run_budget=Budget(max_usd=1.0), prices=unset)
    with pytest.raises(BudgetExceeded, match=r"no known price.*LANTERN_UNKNOWN_MODEL_PRICE"):
        await gate.check("mystery-model-9", REQUEST)
    # A token budget alone can be kept: tokens are counted whatever the price.
    await Gate(run_spent=RunUsage, run_budget=Budget(max_tokens=10_000), prices=unset).check(
        "mystery-model-9", REQUEST
    )


async def test_an_assumed_price_is_charged_and_checked() -> None:
    assumed = prices({"LANTERN_UNKNOWN_MODEL_PRICE": "1000000,1000000"})  # $1 a token
    assert assumed.price("mystery-model-9") == pricing.Price(1_000_000, 1_000_000)
    gate = Gate(run_spent=RunUsage, run_budget=Budget(max_usd=0.5), prices=assumed)
    with pytest.raises(BudgetExceeded, match="maxUsd"):
        await gate.check("mystery-model-9", REQUEST)
    with pytest.raises(UsageError, match="INPUT,OUTPUT"):
        prices({"LANTERN_UNKNOWN_MODEL_PRICE": "free"})
