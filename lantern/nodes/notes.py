"""The kinds of the notes a node journals before its answer (``Noted``).

Nodes sit below the engine, so the kinds they produce are named here, and the journal's
vocabulary (``lantern.engine.events``) takes them from this module rather than repeating them.
"""

from __future__ import annotations

from typing import Final

CONFIDENCE_EVALUATED: Final = "confidence_evaluated"
CONFIDENCE_GATE_BYPASSED: Final = "confidence_gate_bypassed"
