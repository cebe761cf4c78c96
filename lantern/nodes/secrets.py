"""``{{ secrets.NAME }}`` in a step's templates: the workspace's secrets are opened only when
the step dispatches, offered to its templates alone, and scrubbed from whatever the step leaves
behind (its output, its error, the notes journaled with it) before anything is journaled,
traced or logged. Sub-agent and approval nodes get no secrets: what they render is stored (a
child run's input, a prompt shown to a person)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from typing import Any

import jinja2

from lantern.errors import StepError
from lantern.nodes.base import NodeExecutor, Noted, StepContext, Waiting
from lantern.sandbox import Opaque
from lantern.secrets import redact
from lantern.secrets.box import SecretUnreadable

# An ai-step is not among them: a model's answer is journaled, and could carry a secret
# in any form it likes (refused when the definition is applied, lantern/engine/graph.py).
USING = frozenset({"connector", "tool"})


class SecretScope(Mapping[str, Opaque]):
    """``secrets`` as templates see it: each value an opaque ``[secret NAME]`` that may be
    inserted as it is and nothing else (lantern/sandbox.py); a name the workspace lacks
    fails the render naming it."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = {name: Opaque(f"the secret {name}", v) for name, v in values.items()}

    def __getitem__(self, name: str) -> Opaque:
        found = self._values.get(name)
        if found is None:
            raise jinja2.UndefinedError(f"this workspace has no secret named {name!r}")
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def uses_secrets(data: Any) -> bool:
    return "secrets" in json.dumps(data, default=str)


def with_secrets(execute: NodeExecutor) -> NodeExecutor:
    async def run(ctx: StepContext) -> Any:
        if ctx.secrets is None or ctx.node.type not in USING or not uses_secrets(ctx.node.data):
            return await execute(ctx)
        try:
            values = await ctx.secrets()
        except SecretUnreadable as exc:
            raise StepError(str(exc), error_class="tool") from None
        redact.remember(values)
        scrub = redact.Redactor(values)
        # No live text for such a step: a value echoed across two pieces of streamed text
        # could not be scrubbed; its output, scrubbed, is journaled as always.
        scope = {**ctx.scope, "secrets": SecretScope(values)}
        given = dataclasses.replace(ctx, scope=scope, on_text=None)
        try:
            answer = await execute(given)
        except Exception as exc:
            raise scrub.exception(exc)  # noqa: B904 (the same exception, scrubbed in place)
        return _scrubbed(answer, scrub)

    return run


def _scrubbed(answer: Any, scrub: redact.Redactor) -> Any:
    if isinstance(answer, Noted):
        notes = tuple((kind, scrub.value(data)) for kind, data in answer.notes)
        return Noted(_scrubbed(answer.value, scrub), notes)
    if isinstance(answer, Waiting):
        return Waiting(scrub.value(answer.data))
    return scrub.value(answer)
