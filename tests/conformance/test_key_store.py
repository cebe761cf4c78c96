"""The key store role (``KeyStore``): API keys kept hashed, listed per workspace, revoked once,
the same on both backends."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import pytest

from lantern.store import Store
from lantern.store.records import ApiKey


def _key(key_id: str, workspace: str, *scopes: str, name: str | None = None) -> ApiKey:
    created = datetime(2026, 12, 1, 12, 0, tzinfo=UTC) + timedelta(seconds=len(key_id))
    digest = hashlib.sha256(f"secret-of-{key_id}".encode()).hexdigest()
    return ApiKey(key_id, workspace, digest, frozenset(scopes), created, name=name)


async def test_a_key_reads_back_as_it_was_stored(store: Store) -> None:
    made = _key("k1", "w1", "runs:read", "runs:write", name="ci deploy")
    await store.create_api_key(made)
    got = await store.get_api_key("k1")
    assert got is not None
    assert (got.id, got.workspace, got.secret_hash, got.scopes, got.name) == (
        "k1",
        "w1",
        made.secret_hash,
        frozenset({"runs:read", "runs:write"}),
        "ci deploy",
    )
    assert got.created_at == made.created_at and got.revoked_at is None
    assert await store.get_api_key("nope") is None


async def test_keys_are_listed_per_workspace_or_all(store: Store) -> None:
    for key_id, ws in (("a1", "w1"), ("a2", "w1"), ("b1", "w2")):
        await store.create_api_key(_key(key_id, ws, "runs:read"))
    assert sorted(k.id for k in await store.list_api_keys("w1")) == ["a1", "a2"]
    assert [k.id for k in await store.list_api_keys("w2")] == ["b1"]
    assert await store.list_api_keys("w3") == []
    assert sorted(k.id for k in await store.list_api_keys()) == ["a1", "a2", "b1"]


async def test_a_key_is_revoked_once_and_stays_listed_as_revoked(store: Store) -> None:
    await store.create_api_key(_key("k1", "w1", "runs:read"))
    await store.create_api_key(_key("k2", "w1", "runs:read"))
    assert await store.revoke_api_key("k1") is True
    assert await store.revoke_api_key("k1") is False  # no longer a live key
    assert await store.revoke_api_key("nope") is False
    revoked = await store.get_api_key("k1")
    assert revoked is not None and revoked.revoked_at is not None
    other = await store.get_api_key("k2")
    assert other is not None and other.revoked_at is None  # only the one asked for


async def test_a_second_key_with_the_same_id_is_refused(store: Store) -> None:
    await store.create_api_key(_key("k1", "w1", "runs:read"))
    with pytest.raises(Exception):  # noqa: B017 - each backend raises its own integrity error
        await store.create_api_key(_key("k1", "w2", "agents:write"))
    kept = await store.get_api_key("k1")
    assert kept is not None and kept.workspace == "w1"  # the first is untouched
