"""What runs inside a microVM (docs/runtime.md): the harness, its Context, and ``resumed()``.

Standard library only, and nothing here imports the rest of Lantern, so the harness runs in a
VM that has Python and the app directory and nothing else of the host's. The package's only
reader of ``LANTERN_RESUME`` is :func:`lantern.workload.harness.run`; a workload asks
:func:`resumed` instead.
"""

from __future__ import annotations

from lantern.workload.context import CallRefused, Context, StepFailed, Unsupported, resumed
from lantern.workload.entrypoints import entrypoint
from lantern.workload.replies import Approval, ModelReply

__all__ = [
    "Approval",
    "CallRefused",
    "Context",
    "ModelReply",
    "StepFailed",
    "Unsupported",
    "entrypoint",
    "resumed",
]
