"""API keys: random, shown once, stored as a SHA-256 of the secret, scoped, revocable.

A key reads ``lk_<id>_<secret>``. The id finds the stored row; the secret's hash is compared
in constant time. The secret has 256 bits of entropy, so a plain SHA-256 suffices (a slow
password hash protects guessable secrets, which these are not).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
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


async def authenticate(store: Store, authorization: str | None) -> ApiKey:
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.startswith(PREFIX):
        raise Unauthorized("send an API key as 'Authorization: Bearer lk_...'")
    key_id, _, secret = token.removeprefix(PREFIX).partition("_")
    key = await store.get_api_key(key_id) if key_id and secret else None
    # Compare even when the id is unknown, so timing does not tell ids apart.
    expected = key.secret_hash if key is not None else _hash("")
    matches = hmac.compare_digest(expected, _hash(secret))
    if key is None or not matches or key.revoked_at is not None:
        raise Unauthorized("unknown or revoked API key")
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
