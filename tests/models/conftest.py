from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from lantern.models.registry import Models


@pytest.fixture
async def models() -> AsyncIterator[Models]:
    """A model registry of the test's own (no routes, the shipped prices), its SDK clients
    closed with the test's loop."""
    found = Models()
    yield found
    await found.aclose()
