"""Receipt signing keys: Ed25519, from ``LANTERN_SIGNING_KEY`` or the data directory.

``LANTERN_SIGNING_KEY`` holds PEM text (or the path of a PEM file): one or more PKCS#8
``PRIVATE KEY`` blocks and, optionally, ``PUBLIC KEY`` blocks of retired keys. The FIRST private
key signs; every key, private or public, verifies. Rotating means putting a new key first and
keeping the old ones after it. Without the variable, the keys are read from
``<data dir>/signing-keys.pem``, which is created (mode 0600) with one new key on first start.

A key's id (``kid``) is its RFC 7638 JWK thumbprint, so any party can recompute it from ``x``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from lantern.config import Settings
from lantern.errors import UsageError
from lantern.store.base import Store

log = logging.getLogger("lantern.receipts")

KEY_FILE = "signing-keys.pem"
_PEM = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----.+?-----END \1-----", re.DOTALL)
_B64URL = re.compile(r"[A-Za-z0-9_-]*")


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def unb64url(text: str) -> bytes:
    """Strict base64url without padding; ValueError otherwise."""
    if not isinstance(text, str) or not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        raise ValueError("not base64url without padding")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def thumbprint(x: str) -> str:
    """RFC 7638: SHA-256 of the required members in lexicographic order, no whitespace."""
    members = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"))
    return b64url(hashlib.sha256(members.encode()).digest())


@dataclass(frozen=True)
class PublicKey:
    kid: str
    x: str

    @classmethod
    def of(cls, key: Ed25519PublicKey) -> PublicKey:
        raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        x = b64url(raw)
        return cls(thumbprint(x), x)

    def jwk(self) -> dict[str, str]:
        return {"kty": "OKP", "crv": "Ed25519", "kid": self.kid, "x": self.x, "alg": "EdDSA"}


def verifies(jwk: Any, message: bytes, signature: str) -> bool:
    """Whether ``signature`` (base64url) is ``jwk``'s Ed25519 signature of ``message``."""
    try:
        if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
            return False
        key = Ed25519PublicKey.from_public_bytes(unb64url(jwk["x"]))
        key.verify(unb64url(signature), message)
    except (InvalidSignature, ValueError, KeyError, TypeError, AttributeError):
        return False
    return True


@dataclass(frozen=True)
class KeyRing:
    """The key that signs, and every key this process knows (the signer first)."""

    signer: Ed25519PrivateKey
    keys: tuple[PublicKey, ...]

    @property
    def kid(self) -> str:
        return self.keys[0].kid

    def sign(self, message: bytes) -> str:
        return b64url(self.signer.sign(message))


def parse_pem(text: bytes, source: str) -> KeyRing:
    """A key ring from PEM blocks: the first private key signs; UsageError naming ``source``."""
    private: list[Ed25519PrivateKey] = []
    public: list[PublicKey] = []
    for n, block in enumerate(_PEM.finditer(text), start=1):
        label = block.group(1).decode()
        try:
            if "PRIVATE" in label:
                key: Any = serialization.load_pem_private_key(block.group(0), password=None)
                if isinstance(key, Ed25519PrivateKey):
                    private.append(key)
                    public.append(PublicKey.of(key.public_key()))
                    continue
            elif label == "PUBLIC KEY":
                key = serialization.load_pem_public_key(block.group(0))
                if isinstance(key, Ed25519PublicKey):
                    public.append(PublicKey.of(key))
                    continue
        except (ValueError, TypeError) as exc:
            raise UsageError(f"{source}: PEM block {n} cannot be read: {exc}") from exc
        raise UsageError(f"{source}: PEM block {n} ({label}) is not an Ed25519 key")
    if not private:
        raise UsageError(f"{source} holds no Ed25519 private key (PEM 'PRIVATE KEY')")
    # The signer goes first; a key listed twice counts once.
    signer = PublicKey.of(private[0].public_key())
    ordered = [signer] + [k for k in dict.fromkeys(public) if k != signer]
    return KeyRing(private[0], tuple(ordered))


def private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_private(path: Path, content: bytes, *, replace: bool) -> bool:
    """Write ``content`` to ``path`` with mode 0600, atomically: a reader never sees half a
    key. Without ``replace``, False (nothing written) when the file already exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        if replace:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)  # fails if another process created the file first
        except FileExistsError:
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)


def key_file(settings: Settings) -> Path:
    return settings.data_path / KEY_FILE


def load_ring(settings: Settings) -> KeyRing:
    """The keys of LANTERN_SIGNING_KEY, else of the data directory's key file (created with
    one new key when missing)."""
    configured = settings.signing_key
    if configured:
        if "-----BEGIN" in configured:
            return parse_pem(configured.encode(), "LANTERN_SIGNING_KEY")
        try:
            text = Path(configured).read_bytes()
        except OSError as exc:
            raise UsageError(f"LANTERN_SIGNING_KEY: cannot read {configured}: {exc}") from exc
        return parse_pem(text, f"LANTERN_SIGNING_KEY ({configured})")
    path = key_file(settings)
    if not path.exists() and _write_private(
        path, private_pem(Ed25519PrivateKey.generate()), replace=False
    ):
        log.info("generated a receipt signing key in %s", path)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        log.warning("%s is readable by others (mode %o); chmod 600 it", path, mode)
    return parse_pem(path.read_bytes(), str(path))


def rotate(settings: Settings) -> PublicKey:
    """Put a new key first in the data directory's key file (the old ones stay, to verify)."""
    if settings.signing_key:
        raise UsageError("LANTERN_SIGNING_KEY is set: rotate by putting a new key first in it")
    path = key_file(settings)
    old = path.read_bytes() if path.exists() else b""
    key = Ed25519PrivateKey.generate()
    _write_private(path, private_pem(key) + old, replace=True)
    return PublicKey.of(key.public_key())


async def register(store: Store, ring: KeyRing) -> None:
    """Every replica's keys go into the shared database, so each one serves all of them."""
    for key in ring.keys:
        await store.register_signing_key(key.kid, key.x)
