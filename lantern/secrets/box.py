"""Sealing secrets at rest: AES-256-GCM from the ``cryptography`` package.

The key is ``LANTERN_SECRETS_KEY`` (32 bytes, base64url) or, when that is unset, a key file
``secrets.key`` in the data dir, created on first use with mode 0600 and refused when anyone
else may read it. Every replica sharing a database must share the key: each sealed value
carries the id of the key that sealed it, so a replica with another key says so instead of
failing obscurely. The workspace and name are bound into each seal (associated data), so a
sealed value copied to another workspace or name does not open.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from lantern.errors import LanternError, UsageError

SETTING = "LANTERN_SECRETS_KEY"
KEY_FILE = "secrets.key"
NONCE = 12


class SecretUnreadable(LanternError):
    """A sealed secret that this process's key cannot open."""


def _encode(key: bytes) -> str:
    return base64.urlsafe_b64encode(key).decode().rstrip("=")


def _decode(text: str, where: str) -> bytes:
    try:
        key = base64.urlsafe_b64decode(text.strip() + "=" * (-len(text.strip()) % 4))
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != 32:
        raise UsageError(f"{where} is not a base64url-encoded 32-byte key")
    return key


@dataclass(frozen=True)
class Box:
    key: bytes = field(repr=False)

    @property
    def key_id(self) -> str:
        return hashlib.sha256(b"lantern-secrets|" + self.key).hexdigest()[:16]

    def seal(self, workspace: str, name: str, value: str) -> bytes:
        nonce = os.urandom(NONCE)
        return nonce + AESGCM(self.key).encrypt(nonce, value.encode(), _bound(workspace, name))

    def open(self, workspace: str, name: str, key_id: str, sealed: bytes) -> str:
        if key_id != self.key_id:
            raise SecretUnreadable(
                f"secret {name} was sealed with another key (id {key_id}); this replica's "
                f"{SETTING} (or data dir key file) has id {self.key_id}"
            )
        try:
            plain = AESGCM(self.key).decrypt(
                sealed[:NONCE], sealed[NONCE:], _bound(workspace, name)
            )
        except InvalidTag:
            raise SecretUnreadable(f"secret {name} does not open with this key") from None
        return plain.decode()


def _bound(workspace: str, name: str) -> bytes:
    return f"{workspace}\x00{name}".encode()


def load(env_key: str | None, data_dir: Path) -> Box:
    """The box for ``LANTERN_SECRETS_KEY`` when set, else for the data dir's key file."""
    if env_key:
        return Box(_decode(env_key, SETTING))
    path = data_dir / KEY_FILE
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it first: read theirs
        else:
            with os.fdopen(fd, "w") as out:
                out.write(_encode(os.urandom(32)) + "\n")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise UsageError(
            f"{path} may be read by others (mode {mode:o}); chmod 600 it, or set {SETTING}"
        )
    return Box(_decode(path.read_text(), str(path)))
