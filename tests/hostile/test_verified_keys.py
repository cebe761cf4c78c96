"""The keys a replica remembers having verified (``auth.Verified``), on both backends: a
revocation still takes effect within the documented bound, and nothing a client sends with a
wrong or unknown key is remembered or served from memory.

Not a property of a kind of run: a key authenticates requests, whatever runs they touch.
"""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from lantern.errors import Unauthorized
from lantern.server.auth import VERIFIED_S, Verified, authenticate, issue_key
from lantern.store import Store
from lantern.store.records import ApiKey


def bearer(token: str) -> str:
    return f"Bearer {token}"


async def test_a_revoked_key_is_refused_within_the_bound(store: Store) -> None:
    _, token = await issue_key(store, "w", {"runs:read"})
    key_id = token.split("_")[1]
    replica = Verified(ttl=0.3)
    assert (await authenticate(store, bearer(token), replica)).id == key_id
    assert await store.revoke_api_key(key_id)
    # A replica that had not verified it lately refuses it at once ...
    with pytest.raises(Unauthorized):
        await authenticate(store, bearer(token), Verified(ttl=0.3))
    # ... and the one that had, once its memory of the key is older than the bound.
    await asyncio.sleep(0.3)
    with pytest.raises(Unauthorized):
        await authenticate(store, bearer(token), replica)
    assert VERIFIED_S <= 1.0  # the bound docs/security.md states


async def test_a_wrong_secret_for_a_remembered_key_is_refused(store: Store) -> None:
    _, token = await issue_key(store, "w", {"runs:read"})
    replica = Verified()
    await authenticate(store, bearer(token), replica)
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    for wrong in (forged, token + "x", token[:-1], token.rsplit("_", 1)[0] + "_"):
        with pytest.raises(Unauthorized):
            await authenticate(store, bearer(wrong), replica)
    # The attempts took nothing from the key's holder.
    assert (await authenticate(store, bearer(token), replica)).workspace == "w"


async def test_a_failed_lookup_is_not_remembered(store: Store) -> None:
    """A client that sends a wrong secret for someone's key id before its holder's first
    request (a remembered refusal would lock the holder out), or an id that does not exist
    yet: neither refusal outlives the request."""
    _, token = await issue_key(store, "w", {"runs:read"})
    key_id = token.split("_")[1]
    replica = Verified()
    with pytest.raises(Unauthorized):
        await authenticate(store, bearer(f"lk_{key_id}_not-the-secret"), replica)
    assert (await authenticate(store, bearer(token), replica)).id == key_id
    # A revoked key refused once is refused again: its refusal was not remembered as a pass.
    _, other = await issue_key(store, "w", {"runs:read"})
    await store.revoke_api_key(other.split("_")[1])
    for _ in range(2):
        with pytest.raises(Unauthorized):
            await authenticate(store, bearer(other), replica)


async def test_a_remembered_key_is_the_one_stored(store: Store) -> None:
    """Scopes and workspace come from the key's row, whether read now or remembered."""
    made, token = await issue_key(store, "w", {"runs:read", "agents:read"}, name="ci")
    replica = Verified()
    first = await authenticate(store, bearer(token), replica)
    again = await authenticate(store, bearer(token), replica)
    assert first == again
    assert (again.workspace, again.scopes, again.name) == ("w", made.scopes, "ci")


class Counting:
    """The store, counting the key reads that reach it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.reads = 0

    async def get_api_key(self, key_id: str) -> ApiKey | None:
        self.reads += 1
        return await self.store.get_api_key(key_id)


async def test_requests_at_the_same_moment_read_the_key_once(store: Store) -> None:
    """A busy client's requests in flight when its key's time is up read the key's row once,
    and a wrong secret among them, or one that goes away, changes nothing for the rest."""
    _, token = await issue_key(store, "w", {"runs:read"})
    counting = Counting(store)
    replica = Verified()

    async def one(sent: str) -> str:
        try:
            return (await authenticate(cast(Store, counting), bearer(sent), replica)).id
        except Unauthorized:
            return "refused"

    wrong = token.rsplit("_", 1)[0] + "_not-the-secret"
    gone = asyncio.ensure_future(one(token))
    asked = [asyncio.ensure_future(one(t)) for t in [token] * 30 + [wrong]]
    await asyncio.sleep(0)
    gone.cancel()
    answers = await asyncio.gather(*asked)
    assert answers[:30] == [token.split("_")[1]] * 30 and answers[30] == "refused"
    assert counting.reads == 1
    # Nothing is left waiting on a read that finished: the next miss reads again.
    assert (await one(wrong)) == "refused" and counting.reads == 2
