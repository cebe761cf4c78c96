"""The budget gate: before each model call, the spend so far plus the call's estimate must
stay within the run's and the workspace's limits, or the call is never made.

A run's limits are its agent's ``budget: {maxUsd, maxTokens}``; a workspace's come from
``LANTERN_WORKSPACE_BUDGETS`` (JSON: ``{"acme": {"maxUsd": 50, "maxTokens": 2000000}}``)
and cover the runs it created this calendar month (UTC). Spend is read from the journal (a
run's completed model steps; the workspace's runs' usage, kept by the database in the same
transaction as each step), so a crash never resets it.

A call's estimate is its prompt at four characters a token, plus ``maxTokens`` of output
when the step sets it, priced at the model's price (nothing, for a model without one).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lantern.errors import BudgetExceeded, UsageError
from lantern.models import pricing
from lantern.models.records import ModelRequest, TokenUsage
from lantern.models.throttle import Limiter, Reservation
from lantern.store.records import RunUsage


@dataclass(frozen=True)
class Budget:
    max_usd: float | None = None
    max_tokens: int | None = None

    @classmethod
    def from_json(cls, data: Any) -> Budget | None:
        if not data:
            return None
        usd, tokens = data.get("maxUsd"), data.get("maxTokens")
        return cls(None if usd is None else float(usd), None if tokens is None else int(tokens))


def budget_problems(where: str, data: Any) -> list[str]:
    if not isinstance(data, dict):
        return [f"{where}: budget must be an object with maxUsd and/or maxTokens"]
    problems = []
    unknown = set(data) - {"maxUsd", "maxTokens"}
    if unknown:
        problems.append(f"{where}: budget has unknown fields {', '.join(sorted(unknown))}")
    usd = data.get("maxUsd", 0)
    if isinstance(usd, bool) or not isinstance(usd, int | float) or usd < 0:
        problems.append(f"{where}: budget.maxUsd must be a non-negative number")
    tokens = data.get("maxTokens", 0)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        problems.append(f"{where}: budget.maxTokens must be a non-negative integer")
    return problems


def workspace_budgets(raw: str | None) -> dict[str, Budget]:
    """The limits LANTERN_WORKSPACE_BUDGETS (``raw``) sets, by workspace."""
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise UsageError(f"LANTERN_WORKSPACE_BUDGETS is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise UsageError('LANTERN_WORKSPACE_BUDGETS must be {"WORKSPACE": {"maxUsd": ...}}')
    out = {}
    for workspace, limits in data.items():
        problems = budget_problems(f"LANTERN_WORKSPACE_BUDGETS[{workspace!r}]", limits)
        if problems:
            raise UsageError("; ".join(problems))
        budget = Budget.from_json(limits)
        if budget is not None:
            out[str(workspace)] = budget
    return out


def month_start(now: datetime | None = None) -> datetime:
    now = now or datetime.now(UTC)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def estimate(request: ModelRequest) -> TokenUsage:
    chars = len(request.system or "") + sum(len(m.content) for m in request.messages)
    chars += sum(len(json.dumps(dict(t.parameters))) + len(t.description) for t in request.tools)
    return TokenUsage(math.ceil(chars / 4), request.max_tokens or 0)


WorkspaceSpend = Callable[[str, datetime], Awaitable[RunUsage]]


@dataclass(frozen=True)
class Gate:
    """What a step's model calls are checked against. ``run_spent`` is read at call time."""

    run_spent: Callable[[], RunUsage]
    run_budget: Budget | None = None
    workspace: str = "default"
    workspace_spent: WorkspaceSpend | None = None
    # The configured workspace limits (LANTERN_WORKSPACE_BUDGETS) and prices, as the process
    # parsed them at start.
    workspace_budgets: Mapping[str, Budget] = field(default_factory=dict)
    prices: pricing.Prices = field(default_factory=pricing.shipped)
    # The rate limits the calls are held to (docs/rate-limits.md); None: no limits apply.
    limiter: Limiter | None = None

    async def reserve(self, model: str, request: ModelRequest) -> Reservation:
        """Room for the call in every rate limit matching ``model``: its estimated prompt
        plus its maxTokens, and one request; ``Throttled`` when it must wait first."""
        if self.limiter is None:
            return Reservation()
        return await self.limiter.reserve(model, estimate(request).total)

    async def check(self, model: str, request: ModelRequest) -> None:
        guess = estimate(request)
        known = self.prices.price(model)
        guess_usd = (known or pricing.FREE).cost(guess)
        if self.run_budget is not None:
            _unpriced("run", self.run_budget, model, known)
            _check("run", self.run_budget, self.run_spent(), model, guess, guess_usd)
        budget = self.workspace_budgets.get(self.workspace)
        if budget is not None and self.workspace_spent is not None:
            _unpriced(f"workspace {self.workspace!r}", budget, model, known)
            spent = await self.workspace_spent(self.workspace, month_start())
            _check(
                f"workspace {self.workspace!r} (this month)",
                budget,
                spent,
                model,
                guess,
                guess_usd,
            )


def _unpriced(scope: str, budget: Budget, model: str, known: pricing.Price | None) -> None:
    """A dollar budget cannot be kept with a model of unknown price: say so, never pass."""
    if budget.max_usd is not None and known is None:
        raise BudgetExceeded(
            f"budget cannot be checked: the {scope} has a maxUsd budget and model {model!r}"
            " has no known price; add it with LANTERN_MODEL_PRICES or assume one with"
            " LANTERN_UNKNOWN_MODEL_PRICE; the call was not made"
        )


def _check(
    scope: str, budget: Budget, spent: RunUsage, model: str, guess: TokenUsage, guess_usd: float
) -> None:
    if budget.max_tokens is not None and spent.tokens + guess.total > budget.max_tokens:
        raise BudgetExceeded(
            f"budget exceeded: the {scope} has used {spent.tokens} tokens of its maxTokens"
            f" {budget.max_tokens}, and the next call to {model!r} (about {guess.total} tokens)"
            " would pass it; the call was not made"
        )
    if budget.max_usd is not None and spent.cost_usd + guess_usd > budget.max_usd:
        raise BudgetExceeded(
            f"budget exceeded: the {scope} has spent ${spent.cost_usd:.6f} of its maxUsd"
            f" ${budget.max_usd:g}, and the next call to {model!r} (about ${guess_usd:.6f})"
            " would pass it; the call was not made"
        )


def spent_in(usages: Any) -> RunUsage:
    """Sum ``usage`` dicts (as model steps' outputs carry them)."""
    total = RunUsage()
    for u in usages:
        if isinstance(u, dict):
            total = total + RunUsage(
                int(u.get("inputTokens") or 0),
                int(u.get("outputTokens") or 0),
                float(u.get("costUsd") or 0.0),
                1,
            )
    return total
