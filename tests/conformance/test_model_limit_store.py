"""Rate limits on model calls in the store, on both backends: definitions by scope, and the
window every replica moves on with one conditional write (docs/rate-limits.md)."""

from __future__ import annotations

import asyncio

import pytest

from lantern.errors import StepError, Throttled
from lantern.models.throttle import SLOT_MS, SLOTS, Limiter
from lantern.store import Store
from lantern.store.model_limits import SERVER, Slot


class Clock:
    def __init__(self, at_s: float) -> None:
        self.at = at_s

    def __call__(self) -> float:
        return self.at


async def test_limits_are_kept_by_scope_and_replaced_in_place(store: Store) -> None:
    first = await store.put_limit("acme", "tpm", "openai/*", 1000, None)
    await store.put_limit("other", "tpm", "openai/*", 5, 5)
    await store.put_limit(SERVER, "all", "*", None, 100)
    assert first.window == () and first.tokens_per_minute == 1000
    assert [(x.scope, x.name) for x in await store.list_limits(("acme", SERVER))] == [
        (SERVER, "all"),
        ("acme", "tpm"),
    ]
    assert await store.swap_window(first, (Slot(7, 10, 1),))
    again = await store.put_limit("acme", "tpm", "anthropic/*", 2000, 50)
    # A new definition keeps what this minute reserved, and moves the version on.
    assert again.window == (Slot(7, 10, 1),) and again.version > first.version + 1
    assert (again.model, again.tokens_per_minute, again.requests_per_minute) == (
        "anthropic/*",
        2000,
        50,
    )
    assert await store.delete_limit("acme", "tpm")
    assert not await store.delete_limit("acme", "tpm")
    assert await store.get_limit("acme", "tpm") is None
    assert (await store.get_limit("other", "tpm")) is not None


async def test_a_window_moves_only_from_the_version_read(store: Store) -> None:
    limit = await store.put_limit("acme", "tpm", "*", 100, None)
    assert await store.swap_window(limit, (Slot(1, 40, 1),))
    # A replica that read the same version loses: its write would spend the same room twice.
    assert not await store.swap_window(limit, (Slot(1, 90, 1),))
    now = await store.get_limit("acme", "tpm")
    assert now is not None and now.window == (Slot(1, 40, 1),)


async def test_racing_reservations_never_pass_the_limit(store: Store) -> None:
    await store.put_limit("acme", "tpm", "openai/*", 100, None)
    clock = Clock(1_000_000.0)
    limiter = Limiter(store, "acme", clock)

    async def one() -> bool:
        try:
            await limiter.reserve("gpt-x", 10)
        except Throttled:
            return False
        return True

    admitted = await asyncio.gather(*(one() for _ in range(25)))
    assert sum(admitted) == 10  # exactly the room there was, across concurrent writers
    limit = await store.get_limit("acme", "tpm")
    assert limit is not None and sum(s.tokens for s in limit.window) == 100


async def test_a_throttled_call_learns_when_it_fits_and_settles_to_real_usage(
    store: Store,
) -> None:
    await store.put_limit("acme", "tpm", "openai/*", 100, 3)
    await store.put_limit(SERVER, "claude", "anthropic/*", 10, None)  # matches nothing here
    clock = Clock(SLOT_MS / 1000 * 200_000)  # the start of a slot
    limiter = Limiter(store, "acme", clock)
    held = await limiter.reserve("openai/gpt-x", 80)
    await held.settle(30)  # the provider used less than the estimate: the rest comes back
    await limiter.reserve("gpt-x", 70)
    with pytest.raises(Throttled) as caught:
        await limiter.reserve("gpt-x", 10)
    assert caught.value.limit == "tpm"
    # It fits once the slot holding the first two calls has left the window.
    assert SLOTS * SLOT_MS <= caught.value.wait_ms <= SLOTS * SLOT_MS + 1000
    clock.at += caught.value.wait_ms / 1000
    await limiter.reserve("gpt-x", 10)
    # requestsPerMinute counts requests whatever their size.
    await limiter.reserve("gpt-x", 1)
    await limiter.reserve("gpt-x", 1)
    with pytest.raises(Throttled):
        await limiter.reserve("gpt-x", 1)


async def test_a_call_larger_than_the_limit_fails_at_once(store: Store) -> None:
    await store.put_limit(SERVER, "tpm", "openai/*", 50, None)
    with pytest.raises(StepError) as caught:
        await Limiter(store, "acme").reserve("gpt-x", 51)
    assert not caught.value.retryable and not isinstance(caught.value, Throttled)
    assert "'tpm'" in str(caught.value) and "tokensPerMinute 50" in str(caught.value)


async def test_a_refused_call_keeps_nothing_reserved_in_the_limits_it_fit(store: Store) -> None:
    await store.put_limit("acme", "roomy", "*", 1000, None)
    await store.put_limit(SERVER, "tight", "openai/*", 20, None)
    limiter = Limiter(store, "acme", Clock(1_000_000.0))
    await limiter.reserve("gpt-x", 15)
    with pytest.raises(Throttled) as caught:
        await limiter.reserve("gpt-x", 15)
    assert caught.value.limit == "tight"
    roomy = await store.get_limit("acme", "roomy")
    assert roomy is not None and sum(s.tokens for s in roomy.window) == 15
    # Another workspace's calls count against the server's limit, not against acme's own.
    with pytest.raises(Throttled):
        await Limiter(store, "other", Clock(1_000_000.0)).reserve("gpt-x", 15)
    await Limiter(store, "other", Clock(1_000_000.0)).reserve("claude-3", 500)
