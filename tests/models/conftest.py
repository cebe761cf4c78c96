from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from lantern.models import registry


@pytest.fixture(autouse=True)
async def close_model_clients() -> AsyncIterator[None]:
    """In-process runs share the process's SDK clients; close them with the test's loop."""
    yield
    await registry.default().aclose()
