"""API keys: random, shown once, stored as a SHA-256 of the secret, scoped, revocable.

A key reads ``lk_<id>_<secret>``. The id finds the stored row; the secret's hash is compared
in constant time. The secret has 256 bits of entropy, so a plain SHA-256 suffices (a slow
password hash protects guessable secrets, which these are not).

A replica remembers the keys it verified for ``VERIFIED_S`` (``Verified``), so a client's
every request is not a read of the key's row: a revocation (``lantern keys revoke``, written
to the database, not through a replica) stops the key on every replica within that time
(docs/security.md). Only a key that was found, matched and unrevoked is remembered, and a
request is served from memory only when its secret hashes to the remembered one; anything
else is looked up as before, so a wrong secret costs what it did and says nothing of which
ids were used lately. A key's row is read once for the requests that need it at the same
moment (``Verified.lookup``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from lantern.errors import Forbidden, Unauthorized, UsageError
from lantern.store.base import Store
from lantern.store.records import ApiKey

SCOPES = frozenset(
    {
        "runs:execute",
        "runs:read",
        "runs:approve",
        "agents:write",
        "agents:read",
        "secrets:write",
        "secrets:read",
        "admin",
    }
)
# Not a workspace's scope: the cluster's own state (the scheduler, the runtime nodes) spans every
# workspace, so only `lantern keys create --operator` grants it, and a workspace's admin does
# not imply it.
OPERATOR = "operator"
PREFIX = "lk_"
# How long a verified key is trusted without a lookup: the bound on a revocation reaching a
# replica. A second saves nearly every lookup of a client that sends requests back to back.
VERIFIED_S = 1.0
VERIFIED_MAX = 10_000  # keys remembered; the least recently used are forgotten


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


async def issue_key(
    store: Store,
    workspace: str,
    scopes: set[str],
    name: str | None = None,
    *,
    operator: bool = False,
) -> tuple[ApiKey, str]:
    """Store a new key and return it with its plaintext, which is never seen again. ``name``
    labels whoever holds it (a person, a service): it is shown where the key acts. An
    ``operator`` key also reads the cluster's state across workspaces (``OPERATOR``)."""
    unknown = scopes - SCOPES
    if unknown or not (scopes or operator):
        problem = f"unknown scopes {', '.join(sorted(unknown))}" if unknown else "no scopes"
        hint = " (an operator key: --operator)" if OPERATOR in unknown else ""
        raise UsageError(f"{problem}; the scopes are {', '.join(sorted(SCOPES))}{hint}")
    if operator:
        scopes = scopes | {OPERATOR}
    if not workspace or len(workspace) > 100:
        raise UsageError("a workspace name is 1-100 characters")
    if name is not None and (not 1 <= len(name) <= 100 or not name.isprintable()):
        raise UsageError("a key name is 1-100 printable characters")
    key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    key = ApiKey(key_id, workspace, _hash(secret), frozenset(scopes), datetime.now(UTC), name=name)
    await store.create_api_key(key)
    return key, f"{PREFIX}{key_id}_{secret}"


@dataclass
class Verified:
    """The keys this replica verified lately: id -> (key, monotonic time it is trusted until)."""

    ttl: float = VERIFIED_S
    _keys: dict[str, tuple[ApiKey, float]] = field(default_factory=dict)
    _reading: dict[str, asyncio.Future[ApiKey | None]] = field(default_factory=dict)

    def get(self, key_id: str, secret_hash: str) -> ApiKey | None:
        found = self._keys.get(key_id)
        if found is None:
            return None
        key, until = found
        if time.monotonic() >= until:
            del self._keys[key_id]
            return None
        # A wrong secret for a remembered id is neither served nor forgets the entry (which
        # would let anyone who knows an id make its holder's requests slower).
        return key if hmac.compare_digest(key.secret_hash, secret_hash) else None

    def put(self, key: ApiKey) -> None:
        if self.ttl <= 0:
            return
        self._keys.pop(key.id, None)  # re-inserted: dict order is recency
        self._keys[key.id] = (key, time.monotonic() + self.ttl)
        if len(self._keys) > VERIFIED_MAX:
            del self._keys[next(iter(self._keys))]

    async def lookup(self, store: Store, key_id: str) -> ApiKey | None:
        """The key's row, read once for all the requests that ask while the read is under
        way: when a remembered key's time is up, the requests a busy client has in flight
        would each read it (tens on a pool already busy with their runs)."""
        reading = self._reading.get(key_id)
        if reading is None:
            reading = asyncio.ensure_future(store.get_api_key(key_id))
            self._reading[key_id] = reading
            reading.add_done_callback(lambda done: self._read(key_id, done))
        # Shielded: one request going away does not cancel the read the others wait on.
        return await asyncio.shield(reading)

    def _read(self, key_id: str, done: asyncio.Future[ApiKey | None]) -> None:
        self._reading.pop(key_id, None)
        if not done.cancelled():
            done.exception()  # retrieved: every waiter may have gone before it failed


async def authenticate(
    store: Store, authorization: str | None, verified: Verified | None = None
) -> ApiKey:
    """The key of an ``Authorization`` header, found, matched and not revoked; with
    ``verified``, one verified within its ttl is taken from there instead of the store."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.startswith(PREFIX):
        raise Unauthorized("send an API key as 'Authorization: Bearer lk_...'")
    key_id, _, secret = token.removeprefix(PREFIX).partition("_")
    presented = _hash(secret)
    key = None
    if verified is not None and key_id and secret:
        known = verified.get(key_id, presented)
        if known is not None:
            return known
        key = await verified.lookup(store, key_id)
    elif key_id and secret:
        key = await store.get_api_key(key_id)
    # Compare even when the id is unknown, so timing does not tell ids apart.
    expected = key.secret_hash if key is not None else _hash("")
    matches = hmac.compare_digest(expected, presented)
    if key is None or not matches or key.revoked_at is not None:
        raise Unauthorized("unknown or revoked API key")
    if verified is not None:
        verified.put(key)
    return key


def require(key: ApiKey, scope: str) -> None:
    if scope in key.scopes:
        return
    if scope == OPERATOR:
        raise Forbidden(
            "this needs an operator key (lantern keys create --operator);"
            " a workspace's admin key is not one"
        )
    if "admin" not in key.scopes:
        raise Forbidden(f"this key lacks the {scope!r} scope")
