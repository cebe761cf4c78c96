"""A workspace's secrets over the store: named values set, listed (names and times only),
deleted, and opened for a step that dispatches. Nothing here ever returns a value to an API
caller; ``values`` is for the executor alone."""

from __future__ import annotations

import re
from dataclasses import dataclass

from lantern.errors import UsageError
from lantern.secrets.box import Box
from lantern.secrets.redact import MIN_LENGTH
from lantern.store.base import Store
from lantern.store.records import SecretInfo

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
MAX_VALUE = 64 * 1024  # characters


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise UsageError(
            f"secret name {name!r} must be a letter or _ then up to 63 letters, digits or _"
        )
    return name


def check_value(value: object) -> str:
    if not isinstance(value, str):
        raise UsageError("a secret's value must be a string")
    if not MIN_LENGTH <= len(value) <= MAX_VALUE:
        raise UsageError(
            f"a secret's value must be {MIN_LENGTH} to {MAX_VALUE} characters "
            "(shorter ones could not be told apart from ordinary text when they are redacted)"
        )
    if "\x00" in value:
        raise UsageError("a secret's value may not contain NUL characters")
    return value


@dataclass(frozen=True)
class Vault:
    store: Store
    box: Box

    async def set(self, workspace: str, name: str, value: object) -> SecretInfo:
        check_name(name)
        sealed = self.box.seal(workspace, name, check_value(value))
        return await self.store.put_secret(workspace, name, self.box.key_id, sealed)

    async def list(self, workspace: str) -> list[SecretInfo]:
        return await self.store.list_secrets(workspace)

    async def delete(self, workspace: str, name: str) -> bool:
        return await self.store.delete_secret(workspace, check_name(name))

    async def values(self, workspace: str) -> dict[str, str]:
        """Every secret of ``workspace``, opened: raises SecretUnreadable for one sealed under
        another key."""
        return {
            s.name: self.box.open(workspace, s.name, s.key_id, s.sealed)
            for s in await self.store.sealed_secrets(workspace)
        }
