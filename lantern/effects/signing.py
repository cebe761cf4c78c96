"""Signed webhooks: ``Lantern-Signature: t=TIMESTAMP,v1=HEX`` on every http delivery.

``v1`` is the hex HMAC-SHA256, keyed by the workspace's signing secret (its UTF-8 bytes), of
``TIMESTAMP.BODY``: the unix-seconds timestamp, a dot, and the exact bytes sent as the body
(nothing at all for a request without one). While a rotated-out secret is still in its
overlap, the header carries one ``v1=`` per secret, newest first, and a receiver accepts the
request when any of them matches a secret it knows. docs/webhooks.md is the receivers' guide;
``verify`` is its reference check, line for line.

``v2`` (beside ``v1``, for every delivery) also binds where and which delivery: it signs
``TIMESTAMP\nMETHOD\nURL\nIDEMPOTENCY_KEY\nBODY``, so a captured request replayed to another
endpoint of the same workspace, or with another Idempotency-Key, does not verify.
``verify_v2`` is its reference check.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Sequence

HEADER = "Lantern-Signature"
TOLERANCE_S = 300  # how far a receiver lets the timestamp stray from its own clock
SECRET_PREFIX = "lwh_"


def new_secret() -> str:
    """A fresh signing secret: 256 random bits, URL-safe, behind a prefix that says what it is."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def _v1(secret: str, timestamp: int, body: bytes) -> str:
    signed = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def _v2(secret: str, timestamp: int, method: str, url: str, delivery: str, body: bytes) -> str:
    signed = f"{timestamp}\n{method.upper()}\n{url}\n{delivery}\n".encode() + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def sign(
    signing_secrets: Sequence[str],
    body: bytes,
    *,
    timestamp: int | None = None,
    method: str | None = None,
    url: str | None = None,
    delivery: str | None = None,
) -> str:
    """The Lantern-Signature header value for ``body``: one ``v1`` per secret, in order, and
    with ``method``, ``url`` and ``delivery`` (the Idempotency-Key) one ``v2`` per secret."""
    if isinstance(signing_secrets, str):  # a str is a Sequence[str]: never sign per character
        signing_secrets = [signing_secrets]
    if not signing_secrets or not all(signing_secrets):
        raise ValueError("sign() needs at least one secret, and no empty one")
    t = int(time.time()) if timestamp is None else timestamp
    fields = [f"t={t}", *(f"v1={_v1(s, t, body)}" for s in signing_secrets)]
    if method is not None and url is not None and delivery is not None:
        fields += [f"v2={_v2(s, t, method, url, delivery, body)}" for s in signing_secrets]
    return ",".join(fields)


# The receiver's check, as docs/webhooks.md prints it: keep the two identical.
def verify(
    secret: str, header: str, body: bytes, tolerance: int = 300, now: float | None = None
) -> bool:
    """True when ``header`` signs these exact ``body`` bytes with ``secret``, recently enough."""
    fields = [part.strip().partition("=") for part in header.split(",")]
    stamps = [value for key, _, value in fields if key == "t"]
    if len(stamps) != 1 or not (stamps[0].isascii() and stamps[0].isdigit()):
        return False
    if abs((time.time() if now is None else now) - int(stamps[0])) > tolerance:
        return False
    signed = stamps[0].encode() + b"." + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest().encode()
    return any(hmac.compare_digest(expected, v.encode()) for k, _, v in fields if k == "v1")


# The receiver's check of v2, as docs/webhooks.md prints it: keep the two identical.
def verify_v2(
    secret: str,
    header: str,
    body: bytes,
    *,
    method: str,
    url: str,
    delivery: str,
    tolerance: int = 300,
    now: float | None = None,
) -> bool:
    """True when ``header`` signs this body, sent with ``method`` to ``url`` (the URL the
    receiver was given to Lantern as) as delivery ``delivery`` (its Idempotency-Key)."""
    fields = [part.strip().partition("=") for part in header.split(",")]
    stamps = [value for key, _, value in fields if key == "t"]
    if len(stamps) != 1 or not (stamps[0].isascii() and stamps[0].isdigit()):
        return False
    if abs((time.time() if now is None else now) - int(stamps[0])) > tolerance:
        return False
    signed = f"{stamps[0]}\n{method.upper()}\n{url}\n{delivery}\n".encode() + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest().encode()
    return any(hmac.compare_digest(expected, v.encode()) for k, _, v in fields if k == "v2")
