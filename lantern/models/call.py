"""One model call as a step makes it: routed, checked against the budget and the rate
limits (reserved before the call, settled to the reported usage after), priced.

Used by ``ai-step`` nodes and by plain agents' model turns. The result's ``usage`` is what
the step journals (in its output, and beside it for the run's totals).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from lantern import outbound
from lantern.errors import StepError, UsageError
from lantern.models import router
from lantern.models.budget import Gate
from lantern.models.records import ModelRequest, ModelResponse, OnText
from lantern.models.registry import Models, wire_model
from lantern.models.throttle import Reservation


@dataclass(frozen=True)
class ModelResult:
    response: ModelResponse
    model: str  # the model as configured (a route resolves to one of its models)
    cost_usd: float
    priced: bool
    route: dict[str, Any] | None  # {name, tried: [{model, error}]} when a route was used

    def usage_json(self) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "inputTokens": self.response.usage.input_tokens,
            "outputTokens": self.response.usage.output_tokens,
            "costUsd": self.cost_usd,
        }
        if not self.priced:
            usage["priced"] = False  # the model has no price: tokens only
        return usage

    def output(self) -> dict[str, Any]:
        """The fields every model step's output carries."""
        out: dict[str, Any] = {
            "text": self.response.text,
            "model": self.model,
            "provider": self.response.provider,
            "usage": self.usage_json(),
        }
        if self.route is not None:
            out["route"] = self.route
        return out


async def call(
    models: Models, request: ModelRequest, gate: Gate | None, *, on_text: OnText | None = None
) -> ModelResult:
    """``on_text``, when given, receives the answer's text piece by piece as it is generated
    (the provider streams); the result is the same either way."""
    try:
        names = router.candidates(request.model, models.routes)
    except UsageError as exc:
        raise StepError(str(exc), error_class="llm") from exc
    tried: list[dict[str, str]] = []
    for index, model in enumerate(names):
        held = Reservation()
        if gate is not None:
            await gate.check(model, request)
            # Before any connection is taken: a throttled call waits holding none.
            held = await gate.reserve(model, request)
        provider = await models.provider_for(model)
        try:
            async with outbound.QUEUES.slot(f"model:{provider.name}"):
                response = await provider.complete(
                    replace(request, model=wire_model(model)), on_text
                )
        except StepError as exc:
            await held.settle(None)
            if not exc.retryable or index == len(names) - 1:
                raise
            tried.append({"model": model, "error": str(exc)})
            continue
        await held.settle(response.usage.total)
        usd, priced = models.prices.cost(model, response.usage)
        route = None
        if request.model.startswith(router.PREFIX):
            route = {"name": request.model[len(router.PREFIX) :], "tried": tried}
        return ModelResult(response, model, usd, priced, route)
    raise AssertionError("a route has at least one model")  # parse_routes guarantees it


def journal_usage(output: Any) -> dict[str, Any] | None:
    """The ``usage`` a model step's ``step_completed`` carries for the run's totals."""
    if not isinstance(output, dict) or not isinstance(output.get("usage"), dict):
        return None
    u = output["usage"]
    return {
        "inputTokens": int(u.get("inputTokens") or 0),
        "outputTokens": int(u.get("outputTokens") or 0),
        "costUsd": float(u.get("costUsd") or 0.0),
        "modelCalls": int(u.get("modelCalls") or 1),  # 2 with a confidence self-rating
    }
