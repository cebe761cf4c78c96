"""Lantern: durable execution for AI agents.

Users import the App (their tools), the ToolContext a tool may ask for, and the errors.
"""

from lantern.app import App, ToolContext
from lantern.errors import (
    DefinitionError,
    LanternError,
    LeaseLost,
    NotFound,
    StepError,
    StoreError,
    UsageError,
)

__version__ = "0.1.0"

__all__ = [
    "App",
    "DefinitionError",
    "LanternError",
    "LeaseLost",
    "NotFound",
    "StepError",
    "StoreError",
    "ToolContext",
    "UsageError",
    "__version__",
]
