"""The confidence gate of an ai-step: score the answer, and below the threshold park the run
at an implicit approval of the step itself.

``data.confidence = {"threshold": 0.8, "evaluator": "self" | "tool:NAME"}``. ``self`` asks the
same model to rate its answer from 0 to 1 in a second call (its own idempotency key, derived
from the step's, and its usage added to the step's). ``tool:NAME`` calls the user's tool with
``prompt`` and ``output`` and takes the number it returns (or its ``score``). Journaled as
``confidence_evaluated {score, threshold, decision, evaluator}``. When the evaluator tool is
not wired into this process, the gate is bypassed: ``confidence_gate_bypassed`` and the
answer passes, as the spec has it. Approving the parked step passes the answer on; rejecting
it fails the step.
"""

from __future__ import annotations

import re
from typing import Any

from lantern.errors import StepError
from lantern.models.call import call
from lantern.models.records import Message, ModelRequest
from lantern.nodes import notes
from lantern.nodes.base import Noted, StepContext, Waiting

RATE = (
    "Rate how likely it is that the answer below is correct and complete for the request."
    " Reply with one number between 0 and 1 and nothing else.\n\n"
    "Request:\n{prompt}\n\nAnswer:\n{answer}"
)
_NUMBER = re.compile(r"\d*\.?\d+")


async def gate(ctx: StepContext, prompt: str, output: dict[str, Any]) -> Noted:
    conf = ctx.node.data["confidence"]
    threshold = float(conf["threshold"])
    evaluator = str(conf.get("evaluator", "self"))
    if evaluator == "self":
        score, detail = await _self_rating(ctx, prompt, output)
    else:
        name = evaluator.removeprefix("tool:")
        tool = await ctx.tools.find(name)
        if tool is None:
            bypassed = {
                "threshold": threshold,
                "evaluator": evaluator,
                "reason": f"no tool {name!r} is registered in this process: the step passes",
            }
            return Noted(output, ((notes.CONFIDENCE_GATE_BYPASSED, bypassed),))
        value = await tool.call(ctx.tool_context(), {"prompt": prompt, "output": output})
        score, detail = _score(value.get("score") if isinstance(value, dict) else value), {}
    decision = "pass" if score >= threshold else "review"
    evaluated = {
        "score": score,
        "threshold": threshold,
        "decision": decision,
        "evaluator": evaluator,
        **detail,
    }
    noted = ((notes.CONFIDENCE_EVALUATED, evaluated),)
    if decision == "pass":
        return Noted(output, noted)
    wait = {
        "kind": "approval",
        "gate": "confidence",
        "prompt": f"Confidence {score:.2f} is below {threshold:.2f}: pass this answer on?",
        "output": output,  # what the step answers if someone approves
    }
    return Noted(Waiting(wait), noted)


async def _self_rating(
    ctx: StepContext, prompt: str, output: dict[str, Any]
) -> tuple[float, dict[str, Any]]:
    request = ModelRequest(
        model=str(ctx.node.data["model"]),
        messages=(Message("user", RATE.format(prompt=prompt, answer=output["text"])),),
        idempotency_key=ctx.tool_context().key_for("confidence"),
        temperature=0,
        max_tokens=8,
    )
    rating = await call(ctx.models, request, ctx.gate)
    usage, extra = output["usage"], rating.usage_json()
    for field in ("inputTokens", "outputTokens", "costUsd"):
        usage[field] = usage[field] + extra[field]
    usage["modelCalls"] = 2
    return _score(rating.response.text), {"model": rating.model, "usage": extra}


def _score(value: Any) -> float:
    """A number in [0, 1]; an answer that holds none scores 0, so it goes to review."""
    if isinstance(value, bool):
        raise StepError("a confidence evaluator must return a number", error_class="tool")
    if isinstance(value, int | float):
        return min(1.0, max(0.0, float(value)))
    found = _NUMBER.search(str(value))
    return min(1.0, max(0.0, float(found.group()))) if found else 0.0
