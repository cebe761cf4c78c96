"""A model the price table does not know: a dollar budget says it cannot be kept instead of
counting the calls as free, unless the operator assumes a price for unknown models."""

from __future__ import annotations

import pytest

from lantern.errors import BudgetExceeded
from lantern.models import pricing
from lantern.models.budget import Budget, Gate
from lantern.models.records import Message, ModelRequest
from lantern.store.records import RunUsage

REQUEST = ModelRequest("mystery-model-9", (Message("user", "hello"),), "k")


async def test_a_dollar_budget_refuses_a_model_without_a_price(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LANTERN_UNKNOWN_MODEL_PRICE", raising=False)
    gate = Gate(run_spent=RunUsage, run_budget=Budget(max_usd=1.0))
    with pytest.raises(BudgetExceeded, match=r"no known price.*LANTERN_UNKNOWN_MODEL_PRICE"):
        await gate.check("mystery-model-9", REQUEST)
    # A token budget alone can be kept: tokens are counted whatever the price.
    await Gate(run_spent=RunUsage, run_budget=Budget(max_tokens=10_000)).check(
        "mystery-model-9", REQUEST
    )


async def test_an_assumed_price_is_charged_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANTERN_UNKNOWN_MODEL_PRICE", "1000000,1000000")  # $1 a token
    assert pricing.price("mystery-model-9") == pricing.Price(1_000_000, 1_000_000)
    gate = Gate(run_spent=RunUsage, run_budget=Budget(max_usd=0.5))
    with pytest.raises(BudgetExceeded, match="maxUsd"):
        await gate.check("mystery-model-9", REQUEST)
    monkeypatch.setenv("LANTERN_UNKNOWN_MODEL_PRICE", "free")
    with pytest.raises(Exception, match="INPUT,OUTPUT"):
        await gate.check("mystery-model-9", REQUEST)
